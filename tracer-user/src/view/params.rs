//! Query parameters and errors (docs/VIEW_API.md §1): every parameter a
//! query does not know is an error, so a typo is never silently ignored.

use axum::{
    Json,
    http::StatusCode,
    response::{IntoResponse, Response},
};
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("this server needs its token: open the URL it printed (with ?token=...)")]
    Forbidden,
    #[error("{0}")]
    Internal(String),
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let status = match self {
            ApiError::BadRequest(_) => StatusCode::BAD_REQUEST,
            ApiError::NotFound(_) => StatusCode::NOT_FOUND,
            ApiError::Forbidden => StatusCode::FORBIDDEN,
            ApiError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        };
        (status, Json(json!({ "error": self.to_string() }))).into_response()
    }
}

pub fn bad(msg: impl Into<String>) -> ApiError {
    ApiError::BadRequest(msg.into())
}

/// A request's parameters, checked against the names a query takes.
pub struct Params {
    pairs: Vec<(String, String)>,
}

/// Taken by every query: the access token (checked before the handler).
const ALWAYS: [&str; 1] = ["token"];

impl Params {
    pub fn parse(query: Option<&str>, known: &[&str]) -> Result<Params, ApiError> {
        let pairs: Vec<(String, String)> =
            form_urlencoded::parse(query.unwrap_or("").as_bytes()).into_owned().collect();
        for (k, _) in &pairs {
            if !known.contains(&k.as_str()) && !ALWAYS.contains(&k.as_str()) {
                let expected = if known.is_empty() { "none".to_string() } else { known.join(", ") };
                return Err(bad(format!("unknown parameter `{k}` (this query takes: {expected})")));
            }
        }
        Ok(Params { pairs })
    }

    fn values<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.pairs.iter().filter(move |(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    pub fn has(&self, name: &str) -> bool {
        self.values(name).next().is_some()
    }

    /// The one value of `name`, if given.
    pub fn str<'a>(&'a self, name: &'a str) -> Result<Option<&'a str>, ApiError> {
        let mut v = self.values(name);
        let first = v.next();
        if v.next().is_some() {
            return Err(bad(format!("`{name}` is given more than once")));
        }
        Ok(first)
    }

    pub fn num<T: std::str::FromStr>(&self, name: &str) -> Result<Option<T>, ApiError> {
        self.str(name)?.map(|s| parse_num(name, s)).transpose()
    }

    pub fn required<T: std::str::FromStr>(&self, name: &str) -> Result<T, ApiError> {
        self.num(name)?.ok_or_else(|| bad(format!("`{name}` is required")))
    }

    /// Every value of a repeatable parameter.
    pub fn list<T: std::str::FromStr>(&self, name: &str) -> Result<Vec<T>, ApiError> {
        self.values(name).map(|s| parse_num(name, s)).collect()
    }

    /// One of `choices` (`default` when absent).
    pub fn choice<T: Copy>(&self, name: &str, choices: &[(&str, T)], default: Option<T>) -> Result<T, ApiError> {
        match self.str(name)? {
            None => default.ok_or_else(|| bad(format!("`{name}` is required"))),
            Some(v) => choices.iter().find(|(k, _)| *k == v).map(|&(_, t)| t).ok_or_else(|| {
                let names: Vec<&str> = choices.iter().map(|(k, _)| *k).collect();
                bad(format!("`{name}={v}` is not one of {}", names.join(", ")))
            }),
        }
    }

    /// Every value of a repeatable parameter, each one of `choices`.
    pub fn choices<T: Copy>(&self, name: &str, choices: &[(&str, T)]) -> Result<Vec<T>, ApiError> {
        self.values(name)
            .map(|v| {
                choices.iter().find(|(k, _)| *k == v).map(|&(_, t)| t).ok_or_else(|| {
                    let names: Vec<&str> = choices.iter().map(|(k, _)| *k).collect();
                    bad(format!("`{name}={v}` is not one of {}", names.join(", ")))
                })
            })
            .collect()
    }

    /// A pixel size: 1 to 8192.
    pub fn pixels(&self, name: &str) -> Result<u64, ApiError> {
        let v: u64 = self.required(name)?;
        if !(1..=8192).contains(&v) {
            return Err(bad(format!("`{name}={v}` is out of range (1 to 8192 pixels)")));
        }
        Ok(v)
    }

    /// `[from, to)` from two parameters, defaulting to `[0, extent)`.
    pub fn range(&self, from: &str, to: &str, extent: u64) -> Result<(u64, u64), ApiError> {
        let a = self.num::<u64>(from)?.unwrap_or(0);
        let b = self.num::<u64>(to)?.unwrap_or(extent.max(a + 1));
        if a >= b {
            return Err(bad(format!("`{from}={a}` is not below `{to}={b}`")));
        }
        Ok((a, b))
    }
}

fn parse_num<T: std::str::FromStr>(name: &str, s: &str) -> Result<T, ApiError> {
    s.parse().map_err(|_| bad(format!("`{name}={s}` is not a valid number here")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_repeated_and_malformed_parameters_are_errors() {
        assert!(matches!(Params::parse(Some("wx=3"), &["w"]), Err(ApiError::BadRequest(_))));
        let p = Params::parse(Some("w=3&layer=1&layer=2&name=%5Eblk"), &["w", "layer", "name"]).unwrap();
        assert_eq!(p.required::<u64>("w").unwrap(), 3);
        assert_eq!(p.list::<u32>("layer").unwrap(), vec![1, 2]);
        assert!(p.str("layer").is_err());
        assert_eq!(p.str("name").unwrap(), Some("^blk"));
        let p = Params::parse(Some("w=-1"), &["w"]).unwrap();
        assert!(p.required::<u64>("w").is_err());
        assert!(p.range("a", "b", 0).is_ok());
        let p = Params::parse(Some("a=5&b=5"), &["a", "b"]).unwrap();
        assert!(p.range("a", "b", 10).is_err());
    }
}
