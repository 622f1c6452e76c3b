//! Byte sizes and time spans: parsing what users type (`1GiB`, `500MB`,
//! `1073741824`; `90s`, `30m`, `2h`) and printing them so people can read
//! them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A size in bytes that parses IEC (KiB, MiB, GiB, TiB: powers of 1024) and
/// SI (KB, MB, GB, TB: powers of 1000, as Hugging Face uses them) units.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn bytes(self) -> u64 {
        self.0
    }
}

/// The error for a size that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid size {0:?}: use a number of bytes or a unit like 512MiB, 2GiB (powers of 1024) or 5GB (powers of 1000)")]
pub struct BadSize(pub String);

impl FromStr for ByteSize {
    type Err = BadSize;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadSize(s.to_string());
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let unit = unit.trim();
        let mult: u64 = match unit.to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "m" | "mb" => 1_000_000,
            "g" | "gb" => 1_000_000_000,
            "t" | "tb" => 1_000_000_000_000,
            "kib" => 1 << 10,
            "mib" => 1 << 20,
            "gib" => 1 << 30,
            "tib" => 1 << 40,
            _ => return Err(bad()),
        };
        if num.is_empty() {
            return Err(bad());
        }
        if let Ok(n) = num.parse::<u64>() {
            return n.checked_mul(mult).map(ByteSize).ok_or_else(bad);
        }
        let f: f64 = num.parse().map_err(|_| bad())?;
        let v = f * mult as f64;
        if !v.is_finite() || v < 0.0 || v > u64::MAX as f64 {
            return Err(bad());
        }
        Ok(ByteSize(v.round() as u64))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&human(self.0))
    }
}

/// A positive span of time typed as a number and a unit: `500ms`, `90s`,
/// `30m` (or `min`), `2h`; a plain number is seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TimeSpan(pub std::time::Duration);

/// The error for a time span that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {0:?}: use a number and a unit like 90s, 30m or 2h (more than 0)")]
pub struct BadTimeSpan(pub String);

impl FromStr for TimeSpan {
    type Err = BadTimeSpan;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || BadTimeSpan(s.to_string());
        let t = s.trim();
        let split = t
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let secs: f64 = match unit.trim().to_ascii_lowercase().as_str() {
            "ms" => 0.001,
            "" | "s" => 1.0,
            "m" | "min" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        let n: f64 = num.parse().map_err(|_| bad())?;
        std::time::Duration::try_from_secs_f64(n * secs)
            .ok()
            .filter(|d| !d.is_zero())
            .map(TimeSpan)
            .ok_or_else(bad)
    }
}

impl fmt::Display for TimeSpan {
    /// The largest unit that shows the span exactly: `2h`, `90m`, `2s`,
    /// `1500ms`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = self.0.as_millis();
        match ms {
            m if m % 3_600_000 == 0 => write!(f, "{}h", m / 3_600_000),
            m if m % 60_000 == 0 => write!(f, "{}m", m / 60_000),
            m if m % 1000 == 0 => write!(f, "{}s", m / 1000),
            m => write!(f, "{m}ms"),
        }
    }
}

/// A size in IEC units with up to two decimals: `512 B`, `1.50 KiB`, `3.20 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.2} {}", UNITS[unit])
}

/// A signed difference in IEC units (`-1.00 GiB`).
pub fn human_signed(bytes: i128) -> String {
    let sign = if bytes < 0 { "-" } else { "" };
    format!(
        "{sign}{}",
        human(u64::try_from(bytes.unsigned_abs()).unwrap_or(u64::MAX))
    )
}

/// `n` with a comma between each group of three digits (`1,234,567`).
pub fn group_thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_iec_si_and_plain() {
        assert_eq!("1GiB".parse::<ByteSize>().unwrap().0, 1 << 30);
        assert_eq!("5GB".parse::<ByteSize>().unwrap().0, 5_000_000_000);
        assert_eq!("256 MiB".parse::<ByteSize>().unwrap().0, 256 << 20);
        assert_eq!("1.5KiB".parse::<ByteSize>().unwrap().0, 1536);
        assert_eq!("4096".parse::<ByteSize>().unwrap().0, 4096);
        assert_eq!("2mb".parse::<ByteSize>().unwrap().0, 2_000_000);
    }

    #[test]
    fn refuses_garbage() {
        for s in ["", "GiB", "1XB", "-1", "1e400GB", "99999999999999999999TiB"] {
            assert!(s.parse::<ByteSize>().is_err(), "{s}");
        }
    }

    #[test]
    fn parses_and_prints_time_spans() {
        use std::time::Duration;
        let span = |s: &str| s.parse::<TimeSpan>().map(|t| t.0);
        assert_eq!(span("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(span("30m"), Ok(Duration::from_secs(1800)));
        assert_eq!(span("30 min"), Ok(Duration::from_secs(1800)));
        assert_eq!(span("2H"), Ok(Duration::from_secs(7200)));
        assert_eq!(span("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(span("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(span("45"), Ok(Duration::from_secs(45)));
        for bad in ["", "s", "0", "0s", "-1s", "10d", "1e400h", "1..5s"] {
            assert!(bad.parse::<TimeSpan>().is_err(), "{bad}");
        }
        for (text, shown) in [
            ("2h", "2h"),
            ("90m", "90m"),
            ("90s", "90s"),
            ("1.5s", "1500ms"),
        ] {
            assert_eq!(text.parse::<TimeSpan>().unwrap().to_string(), shown);
        }
    }

    #[test]
    fn prints_human_units() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(1536), "1.50 KiB");
        assert_eq!(human(3 << 30), "3.00 GiB");
    }
}
