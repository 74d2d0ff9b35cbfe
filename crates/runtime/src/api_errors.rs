//! What an API server error means, by its reason and, when the body carried none we know, by its
//! HTTP code: one helper per question, used by every component.
//!
//! kube's own `Status::is_not_found` and friends do not fall back to the code: a 404 whose body
//! is not a `Status` (the server's "404 page not found" for a resource type it does not serve,
//! such as a CRD not installed yet) comes back with reason "Failed to parse error data" and is
//! not "not found" to them. These helpers look at both.

use kube::core::Status;

/// The object (or its type) does not exist: reason `NotFound` or code 404.
pub fn not_found(s: &Status) -> bool {
    s.is_not_found() || s.code == 404
}

/// A write lost a race: reason `Conflict` or `AlreadyExists`, or code 409.
pub fn conflict(s: &Status) -> bool {
    s.is_conflict() || s.is_already_exists() || s.code == 409
}

/// The request was refused as invalid: reason `Invalid` or code 422 (also a JSON-patch `test`
/// that failed because another writer changed the field first).
pub fn invalid(s: &Status) -> bool {
    s.is_invalid() || s.code == 422
}

/// Whether `e` is an API error for which [`not_found`] holds.
pub fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if not_found(s))
}

/// Whether `e` is an API error for which [`conflict`] holds.
pub fn is_conflict(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if conflict(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16, reason: &str) -> Status {
        Status::failure("test", reason).with_code(code)
    }

    #[test]
    fn reason_or_code() {
        // A 404 without a Status body: kube's helper alone misses it.
        let page = status(404, "Failed to parse error data");
        assert!(!page.is_not_found(), "kube's helper changed: drop the fallback?");
        assert!(not_found(&page));
        assert!(not_found(&status(404, "NotFound")));
        assert!(!not_found(&status(403, "Forbidden")));
        assert!(conflict(&status(409, "Conflict")));
        assert!(conflict(&status(409, "AlreadyExists")));
        assert!(!conflict(&status(422, "Invalid")));
        assert!(invalid(&status(422, "Invalid")));
        assert!(is_not_found(&kube::Error::Api(Box::new(page))));
    }
}
