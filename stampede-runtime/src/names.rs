//! Cache names: what a cache is called by default, and what a lookup by name finds.

/// Whether the cache called `cache` answers to a lookup by `name`: its own name, or the name
/// written on an associated function of a generic impl that [`function_name`] followed with
/// the instantiation's generic arguments (`name<Args>`). One rule for every lookup by name
/// (`invalidate`, `expire`, `clear`, `stats`, `configure`, the invalidation feed).
pub(crate) fn answers_to(cache: &str, name: &str) -> bool {
    cache == name
        || cache
            .strip_prefix(name)
            .and_then(|rest| rest.strip_prefix('<'))
            .is_some_and(|rest| rest.ends_with('>'))
}

/// The default name of a method's cache: `path::Type::method` for an inherent method, and
/// `<path::Type as path::Trait>::method` for a trait's, with the impl's generic arguments as
/// this instantiation has them. `site` is the `type_name` of a type declared in the method's
/// generated code, whose path runs through the impl (`<path::Type<_> as path::Trait>::...`):
/// the only place a method's trait can be read from.
pub fn method_name(self_type: &str, site: &str, method: &str) -> String {
    match impl_trait(site) {
        Some(trait_path) => format!("<{self_type} as {trait_path}>::{method}"),
        None => format!("{self_type}::{method}"),
    }
}

/// The name of the cache of a function without a receiver and without a companion, which may
/// be an associated function of a generic impl, from `site`: the type name of a closure in its
/// body (its path, `Type<Args>` included for an associated function, then `::{{closure}}`
/// per closure). Without a `written` name, that path; with one, the name followed by the
/// generic arguments in the path (`name<Args>`), so that no two instantiations share a name
/// and the name stays the same in every process. A lookup by `written` reaches them all
/// (`names::answers_to`).
pub fn function_name(written: Option<&str>, site: &str) -> String {
    let mut path = site;
    while let Some(outer) = path.strip_suffix("::{{closure}}") {
        path = outer;
    }
    let Some(written) = written else {
        return path.to_owned();
    };
    let arguments = generic_arguments(path);
    if arguments.is_empty() {
        written.to_owned()
    } else {
        format!("{written}<{}>", arguments.join(", "))
    }
}

/// The generic argument lists in a path as `type_name` writes it, outermost only:
/// `["u8", "alloc::string::String"]` in `<app::Map<u8> as app::Get<alloc::string::String>>::get`.
/// A `<` that follows a name opens arguments; one that opens a qualified path does not.
fn generic_arguments(path: &str) -> Vec<&str> {
    let mut arguments = Vec::new();
    // Per open `<`: whether it opened arguments, and where they start.
    let mut open: Vec<Option<usize>> = Vec::new();
    let mut previous = ' ';
    for (at, c) in path.char_indices() {
        match c {
            '<' => {
                let opens_arguments = previous.is_alphanumeric() || previous == '_';
                open.push(opens_arguments.then_some(at + 1));
            }
            '>' => {
                // Outermost: no argument list is open below this one.
                if let Some(Some(start)) = open.pop()
                    && open.iter().all(Option::is_none)
                {
                    arguments.push(&path[start..at]);
                }
            }
            _ => {}
        }
        previous = c;
    }
    arguments
}

/// `path::Trait` in `<path::Type<_> as path::Trait>::rest`, or `None` for an inherent impl.
fn impl_trait(site: &str) -> Option<&str> {
    let inner = site.strip_prefix('<')?;
    let mut depth = 0usize;
    let mut trait_start = None;
    for (at, c) in inner.char_indices() {
        match c {
            '<' => depth += 1,
            '>' if depth == 0 => return trait_start.map(|start| &inner[start..at]),
            '>' => depth -= 1,
            ' ' if depth == 0 && trait_start.is_none() && inner[at..].starts_with(" as ") => {
                trait_start = Some(at + 4);
            }
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{answers_to, function_name, method_name};

    #[test]
    fn a_methods_name_says_its_trait_and_instantiation() {
        let site = "<app::Store<_> as app::Repo<u8>>::get::{{closure}}::__StampedeSite";
        assert_eq!(
            method_name("app::Store<u16>", site, "get"),
            "<app::Store<u16> as app::Repo<u8>>::get"
        );
        let inherent = "app::Store<_>::label::{{closure}}::__StampedeSite";
        assert_eq!(
            method_name("app::Store<u8>", inherent, "label"),
            "app::Store<u8>::label"
        );
    }

    #[test]
    fn a_function_without_a_receiver_is_named_from_its_body() {
        let free = "app::catalog::product::{{closure}}::{{closure}}";
        assert_eq!(function_name(None, free), "app::catalog::product");
        assert_eq!(function_name(Some("catalog"), free), "catalog");
        let generic = "app::Shelf<app::Euros>::item::{{closure}}::{{closure}}";
        assert_eq!(function_name(None, generic), "app::Shelf<app::Euros>::item");
        assert_eq!(function_name(Some("shelf"), generic), "shelf<app::Euros>");
        let nested = "app::Map<u8, alloc::vec::Vec<u16>>::get::{{closure}}";
        assert_eq!(
            function_name(Some("map"), nested),
            "map<u8, alloc::vec::Vec<u16>>"
        );
        // A trait impl's qualified path opens no arguments; its type's and trait's do.
        let qualified = "<app::Repo as app::Get>::get::{{closure}}";
        assert_eq!(function_name(Some("get"), qualified), "get");
        let both = "<app::Repo<u8> as app::Get<u16>>::get::{{closure}}";
        assert_eq!(function_name(Some("get"), both), "get<u8, u16>");
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
    }
}
