//! The one duration syntax of every Bootsman flag and chart value: a number and a unit, repeated
//! (`500ms`, `90s`, `15m`, `1h30m`, `2d`), or a plain number of seconds. The chart's schema
//! accepts the same form, so a value it lets through never stops a controller at start.

use std::time::Duration;

/// Parses `s`; the error says what is wrong and shows the form.
pub fn parse(s: &str) -> Result<Duration, String> {
    let bad = |why: &str| format!("{s:?} {why}; use a duration such as 500ms, 90s, 15m, 1h30m or 2d");
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        return s.parse().map(Duration::from_secs).map_err(|_| bad("is too long"));
    }
    let mut total = Duration::ZERO;
    let mut rest = s;
    if rest.is_empty() {
        return Err(bad("is empty"));
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad("needs a number before each unit"));
        }
        let n: u64 = rest[..digits].parse().map_err(|_| bad("is too long"))?;
        rest = &rest[digits..];
        let letters = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let part = match &rest[..letters] {
            "ms" => Some(Duration::from_millis(n)),
            "s" => Some(Duration::from_secs(n)),
            "m" => n.checked_mul(60).map(Duration::from_secs),
            "h" => n.checked_mul(3600).map(Duration::from_secs),
            "d" => n.checked_mul(86_400).map(Duration::from_secs),
            "" => return Err(bad("lacks a unit after a number")),
            unit => return Err(bad(&format!("has unknown unit {unit:?} (ms, s, m, h or d)"))),
        };
        rest = &rest[letters..];
        total = part
            .and_then(|p| total.checked_add(p))
            .ok_or_else(|| bad("is too long"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_compounds() {
        for (s, secs, millis) in [
            ("90", 90, 0),
            ("500ms", 0, 500),
            ("90s", 90, 0),
            ("15m", 900, 0),
            ("1h30m", 5400, 0),
            ("720h", 2_592_000, 0),
            ("2d", 172_800, 0),
            ("1m30s250ms", 90, 250),
        ] {
            assert_eq!(
                parse(s),
                Ok(Duration::from_secs(secs) + Duration::from_millis(millis)),
                "{s}"
            );
        }
        for bad in [
            "",
            "m",
            "10x",
            "1h30",
            "h1",
            "-5s",
            "1.5h",
            "99999999999999999999s",
        ] {
            let e = parse(bad).expect_err(bad);
            assert!(e.contains("such as"), "{bad}: {e}");
        }
    }
}
