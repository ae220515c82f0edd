//! The benchmark itself: set the servers up, run every contender through the plan, write the
//! report and the picture, and stop everything.

pub mod cleanup;
pub mod figures;
pub mod fleet;
pub mod load;
pub mod picture;
pub mod postgres;
pub mod redis;
pub mod report;
pub mod setup;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::contender::Contender;
use crate::orchestrate::figures::{ContenderRun, Snapshot, phase_figures};
use crate::orchestrate::fleet::{Fleet, Launch, tree_cpu_seconds};
use crate::orchestrate::load::LoadConfig;
use crate::orchestrate::postgres::{Database, Postgres};
use crate::orchestrate::redis::RedisServer;
use crate::plan::{Action, Plan};

/// The command line of a run.
#[derive(Clone, Debug)]
pub struct Options {
    /// The short plan.
    pub quick: bool,
    /// The load.
    pub load: LoadConfig,
    /// Instances per contender.
    pub instances: usize,
    /// Pool connections per instance.
    pub pool: usize,
    /// Who runs, in order.
    pub contenders: Vec<Contender>,
    /// Where the report and the picture go.
    pub out: PathBuf,
}

/// What every contender's run needs.
struct Bench<'a> {
    options: &'a Options,
    plan: Plan,
    postgres: &'a Postgres,
    db: &'a Database,
    redis: &'a mut RedisServer,
    /// The extra sleep of a query in the slow phase: 9 times its normal execution.
    slow_extra_ms: f64,
    wait_threshold: Duration,
}

/// A free loopback port (bound, then released for the server to take).
pub fn free_port() -> Result<u16, String> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .map(|address| address.port())
        .map_err(|e| format!("no free loopback port: {e}"))
}

/// Runs the benchmark; everything it started is stopped when it returns, or on Ctrl-C.
pub async fn run(options: Options) -> Result<(), String> {
    let _cleanup = cleanup::Cleanup;
    tokio::spawn(cleanup::on_signal());
    let plan = Plan::new(options.quick);
    let binaries = setup::binaries()?;
    eprintln!(
        "storm: PostgreSQL from {}, {}",
        binaries.postgres.display(),
        binaries.redis.display()
    );
    let mut postgres = Postgres::start(&binaries.postgres).await?;
    let result = async {
        let seeded = Instant::now();
        let db = Database::new(postgres.seed().await?);
        let (server_ms, round_trip) = db.calibrate(500).await?;
        eprintln!(
            "storm: PostgreSQL on port {}: 100,000 products seeded in {:.1?}; the product query \
             takes {server_ms:.2}ms at the server, {round_trip:.2?} per round trip (median of 500)",
            postgres.port,
            seeded.elapsed()
        );
        let mut redis = RedisServer::start(binaries.redis.clone()).await?;
        eprintln!("storm: redis-server on port {}", redis.port);
        let mut bench = Bench {
            options: &options,
            plan,
            postgres: &postgres,
            db: &db,
            redis: &mut redis,
            slow_extra_ms: 9.0 * server_ms,
            wait_threshold: (round_trip / 2).max(Duration::from_micros(300)),
        };
        let mut runs = Vec::new();
        for &contender in &options.contenders {
            eprintln!("storm: {} ...", contender.label());
            let run = bench.contender(contender).await?;
            eprint!("{}", report::short(&run));
            runs.push(run);
        }
        let setting = report::Setting {
            quick: options.quick,
            rate: options.load.rate,
            zipf: options.load.zipf,
            instances: options.instances,
            pool: options.pool,
            query_ms: server_ms,
            round_trip,
            slow_extra_ms: bench.slow_extra_ms,
            wait_threshold: bench.wait_threshold,
            plan: bench.plan.clone(),
        };
        redis.stop();
        std::fs::create_dir_all(&options.out)
            .map_err(|e| format!("cannot make {}: {e}", options.out.display()))?;
        let markdown = report::markdown(&setting, &runs);
        let report_path = options.out.join("report.md");
        std::fs::write(&report_path, &markdown)
            .map_err(|e| format!("cannot write {}: {e}", report_path.display()))?;
        let picture_path = options.out.join("storm-timeline.svg");
        picture::draw(&picture_path, &setting, &runs)
            .map_err(|e| format!("cannot draw {}: {e}", picture_path.display()))?;
        println!("{markdown}");
        eprintln!(
            "storm: wrote {} and {}",
            report_path.display(),
            picture_path.display()
        );
        Ok(())
    }
    .await;
    postgres.stop();
    result
}

impl Bench<'_> {
    async fn snapshot(&self, fleet: &Fleet, at: Duration, last: Option<&Snapshot>) -> Snapshot {
        let instances = match fleet.stats().await {
            Ok(stats) => stats,
            Err(error) => {
                eprintln!("storm: {error}; keeping the last figures");
                last.map(|s| s.instances.clone()).unwrap_or_default()
            }
        };
        let db = match self.db.product_queries().await {
            Ok(count) => count,
            Err(error) => {
                eprintln!("storm: {error}");
                last.map(|s| s.db).unwrap_or_default()
            }
        };
        Snapshot {
            at,
            instances,
            cpu: fleet.cpu(),
            db_cpu: tree_cpu_seconds(self.postgres.pid()),
            db,
            redis: Some(self.redis.round_trips()),
        }
    }

    async fn act(&mut self, action: Action) -> Result<(), String> {
        match action {
            Action::SlowDown(factor) => {
                let extra = if factor > 1 {
                    self.slow_extra_ms * f64::from(factor - 1) / 9.0
                } else {
                    0.0
                };
                self.db.set_extra_ms(extra).await
            }
            Action::KillRedis => {
                self.redis.kill();
                Ok(())
            }
            Action::StartRedis => self.redis.restart().await,
        }
    }

    /// One contender through the plan.
    async fn contender(&mut self, contender: Contender) -> Result<ContenderRun, String> {
        self.db.set_extra_ms(0.0).await?;
        self.redis.restart().await?;
        self.redis.flush().await?;
        let redis_url = self.redis.url();
        let fleet = Fleet::start(
            self.options.instances,
            &Launch {
                contender,
                db_port: self.postgres.port,
                pool: self.options.pool,
                redis_url: &redis_url,
                wait_threshold: self.wait_threshold,
            },
        )
        .await?;
        let targets: Vec<_> = fleet.instances.iter().map(|i| i.address).collect();
        let first = self.snapshot(&fleet, Duration::ZERO, None).await;
        let mut samples = vec![(Duration::ZERO, first.db.calls)];
        let mut snapshots = vec![first];
        let running = load::start(&self.options.load, &self.plan, &targets)?;
        let start = running.start;
        let mut actions = self.plan.actions.clone().into_iter().peekable();
        let phases = self.plan.phases.clone();
        let mut next_phase = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
        while next_phase < phases.len() {
            tick.tick().await;
            let at = Instant::now().saturating_duration_since(start);
            while let Some(&(when, action)) = actions.peek() {
                if when > at {
                    break;
                }
                actions.next();
                if let Err(error) = self.act(action).await {
                    eprintln!("storm: {action:?}: {error}");
                }
            }
            if let Ok(count) = self.db.product_queries().await {
                samples.push((at, count.calls));
            }
            while next_phase < phases.len() && at >= phases[next_phase].2 {
                let last = snapshots.last().cloned();
                snapshots.push(self.snapshot(&fleet, at, last.as_ref()).await);
                next_phase += 1;
            }
        }
        let recorded = running.finish().await;
        fleet.stop().await;
        self.db.set_extra_ms(0.0).await?;
        self.db.wait_idle(Duration::from_secs(30)).await?;
        let figures = phases
            .iter()
            .zip(&recorded.phases)
            .enumerate()
            .map(|(index, ((phase, _, _), load))| {
                phase_figures(
                    *phase,
                    load,
                    &snapshots[index],
                    &snapshots[index + 1],
                    &samples,
                )
            })
            .collect();
        Ok(ContenderRun {
            contender,
            phases: figures,
            timeline: recorded.timeline,
            pacing_lag_max_us: recorded.pacing_lag_max_us,
        })
    }
}
