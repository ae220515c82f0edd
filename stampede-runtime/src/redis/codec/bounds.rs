//! The compile-time checks of a cache backed by Redis: its key arguments and values go through
//! serde. Built like the other checks (see `crate::bounds`), and imported by the generated code
//! from `__private::checks` like them.

use crate::checks::{Probe, check};

check!(
    /// An argument that is part of the key of a cache backed by Redis is written as text.
    KeySerialize, KeySerializeCheck, __stampede_key_serialize,
    impl<T> for (T,) where T: [serde::Serialize],
    message = "`{T}` cannot be part of the key of a cache backed by Redis: it does not implement `serde::Serialize`",
    label = "this argument is part of the Redis key, which is written from the arguments with serde",
    note = "derive `serde::Serialize` and `serde::Deserialize` for it, or leave it out of the key with a `key = \"...\"` template",
);

check!(
    /// An argument that is part of the key of a cache backed by Redis has a shape serde can
    /// trace: the cache's identity in Redis includes it.
    KeyDeserialize, KeyDeserializeCheck, __stampede_key_deserialize,
    impl<T> for (T,) where T: [serde::de::DeserializeOwned],
    message = "`{T}` cannot be part of the key of a cache backed by Redis: it does not implement `serde::Deserialize`",
    label = "this argument is part of the Redis key; the cache's identity in Redis includes the key's shape, which is read from its `Deserialize`",
    note = "derive `serde::Deserialize` for it (owning its data), or leave it out of the key with a `key = \"...\"` template",
);

check!(
    /// The value of a cache backed by Redis is stored there.
    ValueSerialize, ValueSerializeCheck, __stampede_value_serialize,
    impl<T> for Probe<T> where T: [serde::Serialize],
    message = "a cache backed by Redis cannot store `{T}`: it does not implement `serde::Serialize`",
    label = "this cache keeps its values in Redis (`lock = \"redis\"` or `backend = \"tiered\" | \"redis\"`), written with serde",
    note = "derive `serde::Serialize` and `serde::Deserialize` for it, or keep the cache in memory (`lock = \"local\"`, `backend = \"memory\"`)",
);

check!(
    /// The value of a cache backed by Redis is read back from there.
    ValueDeserialize, ValueDeserializeCheck, __stampede_value_deserialize,
    impl<T> for Probe<T> where T: [serde::de::DeserializeOwned],
    message = "a cache backed by Redis cannot store `{T}`: it does not implement `serde::Deserialize`",
    label = "this cache reads its values back from Redis (`lock = \"redis\"` or `backend = \"tiered\" | \"redis\"`) with serde",
    note = "derive `serde::Deserialize` for it (owning its data: no borrowed `&str` fields), or keep the cache in memory",
);

check!(
    /// The `T` of a `Result<T, E>` cached in Redis is stored there.
    OkSerialize, OkSerializeCheck, __stampede_ok_serialize,
    impl<T, E> for Probe<Result<T, E>> where T: [serde::Serialize],
    message = "a cache backed by Redis cannot store `{T}`: it does not implement `serde::Serialize`",
    label = "this cache keeps its values in Redis (`lock = \"redis\"` or `backend = \"tiered\" | \"redis\"`), written with serde",
    note = "derive `serde::Serialize` and `serde::Deserialize` for it, or keep the cache in memory (`lock = \"local\"`, `backend = \"memory\"`)",
);

check!(
    /// The `T` of a `Result<T, E>` cached in Redis is read back from there.
    OkDeserialize, OkDeserializeCheck, __stampede_ok_deserialize,
    impl<T, E> for Probe<Result<T, E>> where T: [serde::de::DeserializeOwned],
    message = "a cache backed by Redis cannot store `{T}`: it does not implement `serde::Deserialize`",
    label = "this cache reads its values back from Redis (`lock = \"redis\"` or `backend = \"tiered\" | \"redis\"`) with serde",
    note = "derive `serde::Deserialize` for it (owning its data: no borrowed `&str` fields), or keep the cache in memory",
);
