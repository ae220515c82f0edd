//! Templates: `key = "user:{id}"` names the arguments that form a call's key, and each of
//! `tags = ["user:{id}", ..]` renders a tag from them.

use syn::LitStr;

use crate::diag::error;

/// A parsed template: literal text and `{argument}` holes, in order. `{{` and `}}` stand for
/// literal braces.
#[derive(Clone)]
pub(crate) struct KeyTemplate {
    pub(crate) segments: Vec<Segment>,
}

#[derive(Clone, PartialEq, Eq, Debug)]
pub(crate) enum Segment {
    Text(String),
    Arg(String),
}

impl KeyTemplate {
    /// Parses the template `literal`; `what` ("key", "tag") names it in errors.
    pub(crate) fn parse(literal: &LitStr, what: &str) -> syn::Result<KeyTemplate> {
        let segments = segments(&literal.value(), what)
            .map_err(|(message, help)| error(literal.span(), message, help))?;
        Ok(KeyTemplate { segments })
    }

    /// The argument names the template uses, each once, in order of first use.
    pub(crate) fn args(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for segment in &self.segments {
            if let Segment::Arg(name) = segment
                && !names.contains(&name.as_str())
            {
                names.push(name);
            }
        }
        names
    }

    /// The template written back in one canonical form (`{{` and `}}` for literal braces): part
    /// of the cache's identity in a shared tier, so that `"user:{id}"` and `"admin:{id}"`
    /// under one `name` never share keys.
    pub(crate) fn canonical(&self) -> String {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Text(text) => out.push_str(&text.replace('{', "{{").replace('}', "}}")),
                Segment::Arg(name) => {
                    out.push('{');
                    out.push_str(name);
                    out.push('}');
                }
            }
        }
        out
    }
}

fn segments(template: &str, what: &str) -> Result<Vec<Segment>, (String, String)> {
    let mut segments = Vec::new();
    let mut text = String::new();
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '{' if chars.peek() == Some(&'{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek() == Some(&'}') => {
                chars.next();
                text.push('}');
            }
            '{' => {
                let mut name = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    name.push(c);
                }
                if !closed {
                    return Err((
                        format!("the {what} template \"{template}\" opens a `{{` it never closes"),
                        "close it, as in \"user:{id}\", or write `{{` for a literal brace".into(),
                    ));
                }
                if !is_identifier(&name) {
                    return Err((
                        format!("`{{{name}}}` in the {what} template does not name an argument"),
                        "write an argument's name between the braces, as in \"user:{id}\"".into(),
                    ));
                }
                if !text.is_empty() {
                    segments.push(Segment::Text(std::mem::take(&mut text)));
                }
                segments.push(Segment::Arg(name));
            }
            '}' => {
                return Err((
                    format!("the {what} template \"{template}\" has a `}}` with no `{{` before it"),
                    "write `}}` for a literal brace".into(),
                ));
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        segments.push(Segment::Text(text));
    }
    Ok(segments)
}

fn is_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c == '_' || c.is_alphabetic())
        && chars.all(|c| c == '_' || c.is_alphanumeric())
        && name != "_"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_text_and_arguments() {
        assert_eq!(
            segments("user:{id}:{name}", "key").unwrap(),
            vec![
                Segment::Text("user:".into()),
                Segment::Arg("id".into()),
                Segment::Text(":".into()),
                Segment::Arg("name".into()),
            ]
        );
        assert_eq!(
            segments("{{x}}{id}", "key").unwrap(),
            vec![Segment::Text("{x}".into()), Segment::Arg("id".into()),]
        );
    }

    #[test]
    fn rejects_broken_braces() {
        assert!(segments("user:{id", "key").is_err());
        assert!(segments("user:id}", "key").is_err());
        assert!(segments("user:{}", "key").is_err());
        assert!(segments("user:{1x}", "key").is_err());
    }
}
