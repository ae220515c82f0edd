//! Cache names: what a cache is called by default, and what a lookup by name finds.

/// Whether the cache called `cache` answers to a lookup by `name`: its own name, or its
/// [`stem`] (a written name that [`written_name`] followed with what tells one function's
/// caches apart, `name<Args>`, or a generic free function's default name). One rule for every
/// lookup by name (`invalidate`, `expire`, `clear`, `stats`, `configure`, the invalidation
/// feed).
pub(crate) fn answers_to(cache: &str, name: &str) -> bool {
    // What `answered_by(cache)` holds, without parsing a name that cannot have `name` as its
    // stem (one that does not begin `name<`): a clear by name asks it of every key it scans.
    cache == name
        || (cache
            .strip_prefix(name)
            .is_some_and(|rest| rest.starts_with('<'))
            && stem(cache) == Some(name))
}

/// The names the cache named `cache` answers to ([`answers_to`]): its stem when it has one,
/// then its own name. What the registry and the options set at run time are looked up by, so
/// that a lookup costs the same however many caches and names the process has.
pub(crate) fn answered_by(cache: &str) -> impl Iterator<Item = &str> {
    stem(cache).into_iter().chain(std::iter::once(cache))
}

/// The name one function's caches share when `cache` is one of several (`name` in `name<Args>`,
/// `app::rows` in `app::rows<u8>`): what a lookup reaching them all asks for, and what their
/// identities are registered under in Redis too, so that it reaches another process's.
/// `None` for a name that ends in no argument list.
pub(crate) fn stem(cache: &str) -> Option<&str> {
    // The last list, when it closes the name: a list follows a name, so a qualified path's
    // `<..>` (`<A as B>`) is none.
    let last = argument_lists(cache).pop()?;
    (last.end + 1 == cache.len()).then(|| &cache[..last.start - 1])
}

/// The default name of a method's cache: `path::Type::method` for an inherent method or a
/// trait's default method, and `<path::Type as path::Trait>::method` for a trait impl's, with
/// the impl's generic arguments as this instantiation has them, in its type and its trait.
/// `shape` is the `type_name` of a type declared in the method's generated code, whose path
/// runs through the impl (`<path::Type<_> as path::Trait<_>>::...`): qualified only in a trait
/// impl. `site` is the type name of a closure in the method's body, which writes the trait as
/// instantiated (`<path::Type<u8> as path::Trait<u16>>::...`).
pub fn method_name(self_type: &str, shape: &str, site: &str, method: &str) -> String {
    match qualified(shape).and(qualified(site)) {
        Some((_, trait_path)) => format!("<{self_type} as {trait_path}>::{method}"),
        None => format!("{self_type}::{method}"),
    }
}

/// The default name of the cache of a function without a receiver or a companion, which may be
/// an associated function of a generic impl: its path as its body sees it, `site` being the
/// type name of a closure there (`app::Shelf<app::Euros>::item::{{closure}}`), without its
/// closures (`app::Shelf<app::Euros>::item`).
pub fn function_name(site: &str) -> String {
    let mut path = site;
    while let Some(outer) = path.strip_suffix("::{{closure}}") {
        path = outer;
    }
    path.to_owned()
}

/// The name of the cache of a function given `name = "written"`: `written`, followed where one
/// function has a cache per instantiation or implementor by what tells them apart, so that no
/// two share a name, or a Redis key, and each is named alike in every process.
///
/// `site` is the type name of a closure in the function's body, which writes the impl as
/// instantiated (`app::Shelf<app::Euros>::item::{{closure}}`); `shape` that of a type declared
/// there, which writes the impl's parameters as `_` (`app::Shelf<_>::item::Site`):
/// - in an impl, the arguments of its type and trait where the shape has `_`
///   (`written<app::Euros>`), so a concrete impl (`impl Repo<Postgres>`) keeps the name as
///   written;
/// - in a trait's default method, where the site names the implementor
///   (`<app::Shop as app::Priced>::price::{{closure}}`) and the shape does not, the implementor
///   (`written<app::Shop>`).
///
/// A lookup by `written` reaches every instantiation (`answers_to`).
pub fn written_name(written: &str, site: &str, shape: &str) -> String {
    if let (Some((implementor, _)), None) = (qualified(site), qualified(shape)) {
        return format!("{written}<{implementor}>");
    }
    let arguments: Vec<&str> = generic_arguments(site)
        .into_iter()
        .zip(generic_arguments(shape))
        .flat_map(|(arguments, parameters)| {
            top_level(arguments)
                .into_iter()
                .zip(top_level(parameters))
                .filter(|(_, parameter)| *parameter == "_")
                .map(|(argument, _)| argument)
        })
        .collect();
    if arguments.is_empty() {
        written.to_owned()
    } else {
        format!("{written}<{}>", arguments.join(", "))
    }
}

/// The generic argument lists in a path as `type_name` writes it, outermost only:
/// `["u8", "alloc::string::String"]` in `<app::Map<u8> as app::Get<alloc::string::String>>::get`.
fn generic_arguments(path: &str) -> Vec<&str> {
    argument_lists(path)
        .into_iter()
        .map(|list| &path[list])
        .collect()
}

/// Where [`generic_arguments`]' lists are in `path`, between their `<` and `>`. A `<` that
/// follows a name opens arguments; one that opens a qualified path does not.
fn argument_lists(path: &str) -> Vec<std::ops::Range<usize>> {
    let mut lists = Vec::new();
    // Per open `<`: where the arguments it opened start, if it opened arguments.
    let mut open: Vec<Option<usize>> = Vec::new();
    let mut previous = ' ';
    for (at, c) in path.char_indices() {
        match c {
            '<' => {
                let opens_arguments = previous.is_alphanumeric() || previous == '_';
                open.push(opens_arguments.then_some(at + 1));
            }
            // A function pointer's `->` closes nothing.
            '>' if previous == '-' => {}
            '>' => {
                // Outermost: no argument list is open below this one.
                if let Some(Some(start)) = open.pop()
                    && open.iter().all(Option::is_none)
                {
                    lists.push(start..at);
                }
            }
            _ => {}
        }
        previous = c;
    }
    lists
}

/// The arguments of one list, split at its own commas: `["u8", "app::Map<u8, u16>"]` in
/// `u8, app::Map<u8, u16>`.
fn top_level(list: &str) -> Vec<&str> {
    let (mut parts, mut depth, mut start) = (Vec::new(), 0usize, 0);
    let mut previous = ' ';
    for (at, c) in list.char_indices() {
        match c {
            '>' if previous == '-' => {}
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(list[start..at].trim());
                start = at + 1;
            }
            _ => {}
        }
        previous = c;
    }
    parts.push(list[start..].trim());
    parts
}

/// `path::Type<_>` and `path::Trait` in `<path::Type<_> as path::Trait>::rest`; `None` for a
/// path that is not qualified (an inherent impl's, a free function's, a trait's own).
fn qualified(site: &str) -> Option<(&str, &str)> {
    let inner = site.strip_prefix('<')?;
    let mut depth = 0usize;
    let mut as_at = None;
    let mut previous = ' ';
    for (at, c) in inner.char_indices() {
        match c {
            '>' if previous == '-' => {}
            '<' => depth += 1,
            '>' if depth == 0 => {
                return as_at.map(|as_at| (&inner[..as_at], &inner[as_at + 4..at]));
            }
            '>' => depth -= 1,
            ' ' if depth == 0 && as_at.is_none() && inner[at..].starts_with(" as ") => {
                as_at = Some(at);
            }
            _ => {}
        }
        previous = c;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{answered_by, answers_to, function_name, method_name, stem, written_name};

    #[test]
    fn a_methods_name_says_its_trait_and_instantiation() {
        let shape = "<app::Store<_> as app::Repo<_>>::get::{{closure}}::__StampedeSite";
        let site = "<app::Store<u16> as app::Repo<u8>>::get::{{closure}}::{{closure}}";
        assert_eq!(
            method_name("app::Store<u16>", shape, site, "get"),
            "<app::Store<u16> as app::Repo<u8>>::get"
        );
        let inherent = "app::Store<_>::label::{{closure}}::__StampedeSite";
        let site = "app::Store<u8>::label::{{closure}}::{{closure}}";
        assert_eq!(
            method_name("app::Store<u8>", inherent, site, "label"),
            "app::Store<u8>::label"
        );
        // A trait's default method: named after the implementor.
        let default = "app::Priced::price::{{closure}}::__StampedeSite";
        let site = "<app::Shop as app::Priced>::price::{{closure}}::{{closure}}";
        assert_eq!(
            method_name("app::Shop", default, site, "price"),
            "app::Shop::price"
        );
    }

    #[test]
    fn a_function_without_a_receiver_is_named_from_its_body() {
        let free = "app::catalog::product::{{closure}}::{{closure}}";
        assert_eq!(function_name(free), "app::catalog::product");
        let generic = "app::Shelf<app::Euros>::item::{{closure}}::{{closure}}";
        assert_eq!(function_name(generic), "app::Shelf<app::Euros>::item");
    }

    #[test]
    fn a_written_name_is_followed_by_the_instantiations_arguments() {
        let shelf = |site: &str| written_name("shelf", site, "app::Shelf<_>::item::{{closure}}::S");
        assert_eq!(
            shelf("app::Shelf<app::Euros>::item::{{closure}}::{{closure}}"),
            "shelf<app::Euros>"
        );
        assert_eq!(
            shelf("app::Shelf<(u8, alloc::vec::Vec<u16>)>::item::{{closure}}"),
            "shelf<(u8, alloc::vec::Vec<u16>)>"
        );
        // A function pointer's `->` closes no list.
        assert_eq!(
            shelf("app::Shelf<fn(u8) -> u16>::item::{{closure}}"),
            "shelf<fn(u8) -> u16>"
        );
        assert_eq!(
            written_name(
                "get",
                "<app::Map<fn() -> u8, u16> as app::Get<i32>>::get::{{closure}}",
                "<app::Map<_, u16> as app::Get<_>>::get::S"
            ),
            "get<fn() -> u8, i32>"
        );
        // Free, or a concrete impl: as written.
        assert_eq!(
            written_name("product", "app::product::{{closure}}", "app::product::S"),
            "product"
        );
        assert_eq!(
            written_name(
                "repo",
                "app::Repo<app::Postgres>::get::{{closure}}",
                "app::Repo<app::Postgres>::get::S"
            ),
            "repo"
        );
        // The impl's parameters, in its type and its trait.
        assert_eq!(
            written_name(
                "get",
                "<app::Map<alloc::string::String, u16> as app::Get<i32>>::get::{{closure}}",
                "<app::Map<_, u16> as app::Get<_>>::get::S"
            ),
            "get<alloc::string::String, i32>"
        );
        assert_eq!(
            written_name(
                "get",
                "<app::Repo as app::Get>::get::{{closure}}",
                "<app::Repo as app::Get>::get::S"
            ),
            "get"
        );
        // A trait's default method.
        assert_eq!(
            written_name(
                "price",
                "<app::Shop as app::Priced>::price::{{closure}}",
                "app::Priced::price::{{closure}}::S"
            ),
            "price<app::Shop>"
        );
    }

    #[test]
    fn a_lookup_by_a_written_name_finds_its_instantiations() {
        assert!(answers_to("shelf", "shelf"));
        assert!(answers_to("shelf<app::Euros>", "shelf"));
        assert!(answers_to("shelf<app::Euros>", "shelf<app::Euros>"));
        assert!(!answers_to("shelf<app::Euros>", "shelf<app::Cents>"));
        assert!(!answers_to("shelves", "shelf"));
        assert!(!answers_to("shelf", "shelf<app::Euros>"));
        assert!(!answers_to("app::Store<u8>::label", "app::Store"));
        // Only the last list, whole: not a function nested in a generic one.
        assert!(answers_to("app::rows<u8>", "app::rows"));
        assert!(!answers_to("app::outer<u8>::inner<u16>", "app::outer"));
        assert!(answers_to(
            "app::outer<u8>::inner<u16>",
            "app::outer<u8>::inner"
        ));
    }

    #[test]
    fn a_cache_answers_to_exactly_the_names_it_is_looked_up_by() {
        let names = [
            "shelf",
            "shelf<app::Euros>",
            "shelf<app::Cents>",
            "shelves",
            "shelf<u8",
            "app::Store",
            "app::Store<u8>::label",
            "app::rows<u8>",
            "app::rows",
            "app::outer",
            "app::outer<u8>::inner",
            "app::outer<u8>::inner<u16>",
            "<app::Ledger as app::Book<u8>>",
            "<app::Ledger as app::Book<u8>>::get<u16>",
            "<app::Ledger as app::Book<u8>>::get",
        ];
        for cache in names {
            let by: Vec<&str> = answered_by(cache).collect();
            assert_eq!(
                by.last(),
                Some(&cache),
                "{cache} answers to its own name, last"
            );
            for name in names {
                assert_eq!(
                    answers_to(cache, name),
                    by.contains(&name),
                    "{cache} looked up by {name}"
                );
            }
        }
    }

    #[test]
    fn a_stem_is_the_name_before_its_last_argument_list() {
        assert_eq!(stem("shelf<app::Euros>"), Some("shelf"));
        assert_eq!(stem("shelf<app::Map<u8, u16>, u8>"), Some("shelf"));
        assert_eq!(stem("shelf<fn(u8) -> u16>"), Some("shelf"));
        assert_eq!(stem("shelf<fn(u8) -> app::Row<u8>>"), Some("shelf"));
        assert_eq!(stem("shelf"), None);
        assert_eq!(stem("app::Store<u8>::label"), None);
        assert_eq!(stem("<app::Ledger as app::Book<u8>>"), None);
        assert_eq!(stem("<a>"), None);
        assert_eq!(stem("shelf<u8"), None);
        assert_eq!(stem("shelf u8>"), None);
        assert_eq!(stem("f->"), None);
    }

    #[test]
    fn a_written_name_on_a_method_follows_its_impl_or_its_implementor() {
        let (site, shape) = (
            "<app::Ledger<app::Euros> as app::Book<u8>>::entry::{{closure}}::{{closure}}",
            "<app::Ledger<_> as app::Book<_>>::entry::{{closure}}::S",
        );
        assert_eq!(
            written_name("ledger", site, shape),
            "ledger<app::Euros, u8>"
        );
        // A companion, in an inherent impl.
        let (site, shape) = (
            "app::Ledger<app::Euros>::entry_config::{{closure}}",
            "app::Ledger<_>::entry_config::S",
        );
        assert_eq!(written_name("ledger", site, shape), "ledger<app::Euros>");
        // A trait's default method: the implementor.
        let (site, shape) = (
            "<app::Shop<u8> as app::Priced>::price::{{closure}}::{{closure}}",
            "app::Priced::price::{{closure}}::S",
        );
        assert_eq!(written_name("price", site, shape), "price<app::Shop<u8>>");
    }
}
