//! Memory sizes: absolute bytes or a fraction of a device's total memory.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// Every resolved size is a multiple of this many bytes (RMM's allocation alignment).
pub const ALIGNMENT: u64 = 256;

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;
const PIB: u64 = 1 << 50;

/// Units accepted after a number, compared case-insensitively. Single letters ("2G") are
/// rejected on purpose: whether they mean 10^9 or 2^30 differs between tools.
const UNITS: &[(&str, u64)] = &[
    ("b", 1),
    ("kb", 1_000),
    ("mb", 1_000_000),
    ("gb", 1_000_000_000),
    ("tb", 1_000_000_000_000),
    ("pb", 1_000_000_000_000_000),
    ("kib", KIB),
    ("mib", MIB),
    ("gib", GIB),
    ("tib", TIB),
    ("pib", PIB),
];

/// A memory size as written: an integer of bytes (`1073741824`); a number with a unit
/// (`"2GiB"`, `"1.5 GB"`; B, kB…PB powers of 1000, KiB…PiB powers of 1024, case-insensitive);
/// or a percentage or float, a fraction of the device's **total** memory (`"50%"`, `0.5`, and
/// as text `"0.5"`, as a decimal point cannot be a byte count). Zero, negative values and
/// fractions above 100 % are rejected.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
// Through `toml::Value` so that serde and the loader share one parser.
#[serde(try_from = "toml::Value", into = "toml::Value")]
pub enum Size {
    /// An absolute number of bytes.
    Bytes(u64),
    /// A fraction of the device's total memory, in `(0, 1]`.
    Fraction(f64),
}

/// Why a text or TOML value is not a [`Size`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseSizeError {
    /// Not a number, a number with a known unit, or a percentage.
    #[error("not a size")]
    Malformed,
    /// A negative number.
    #[error("a size cannot be negative")]
    Negative,
    /// Zero (or a value that is zero bytes, such as `"0.1B"`).
    #[error("a size of zero is not allowed")]
    Zero,
    /// A fraction above 1 or a percentage above 100 %.
    #[error("a fraction of device memory cannot exceed 100%")]
    FractionAboveWhole,
    /// A whole float above 1 (`8e9`): floats are fractions, so it is most likely bytes.
    #[error(
        "a float is a fraction of device memory (at most 1.0), and this one is a whole number \
         above 1: write a byte count as an integer or as text such as \"8GB\""
    )]
    WholeFloat,
    /// More bytes than fit in 64 bits.
    #[error("a size cannot exceed 16 EiB")]
    Overflow,
}

/// Bytes for messages: `40GiB` when short and exact, else `85520809984 bytes (79.6 GiB)`.
pub(crate) fn human(bytes: u64) -> String {
    match unit_parts(bytes) {
        Some((count, name)) if count < 10_000 => format!("{count}{name}"),
        _ => format!("{bytes} bytes ({:.1} GiB)", bytes as f64 / GIB as f64),
    }
}

/// Rounds `bytes` down to a multiple of [`ALIGNMENT`].
pub fn align_down(bytes: u64) -> u64 {
    bytes - bytes % ALIGNMENT
}

impl Size {
    /// The bytes this size stands for on a device of `total_memory` bytes, rounded **down** to a
    /// multiple of 256 as RMM aligns pool sizes (never more than written): 0 below 256 bytes,
    /// which [`crate::Config::resolve`] reports.
    pub fn resolve(&self, total_memory: u64) -> u64 {
        align_down(self.unaligned(total_memory))
    }

    /// The size before rounding to the alignment (what the user asked for).
    pub(crate) fn unaligned(&self, total_memory: u64) -> u64 {
        match *self {
            Size::Bytes(n) => n,
            // Truncation is intended: a fraction never rounds up past what it names.
            Size::Fraction(f) => (total_memory as f64 * f) as u64,
        }
    }

    /// Parses a TOML value: an integer (bytes), a float (fraction) or a string (see [`FromStr`]).
    ///
    /// # Errors
    /// [`ParseSizeError::Zero`] or [`ParseSizeError::Negative`] for such an integer, the errors of
    /// a fraction or a string otherwise, and [`ParseSizeError::Malformed`] for any other TOML type.
    pub fn from_toml(value: &toml::Value) -> Result<Size, ParseSizeError> {
        match value {
            toml::Value::Integer(i) => match u64::try_from(*i) {
                Ok(0) => Err(ParseSizeError::Zero),
                Ok(n) => Ok(Size::Bytes(n)),
                Err(_) => Err(ParseSizeError::Negative),
            },
            toml::Value::Float(f) => float(*f),
            toml::Value::String(s) => s.parse(),
            _ => Err(ParseSizeError::Malformed),
        }
    }

    /// The TOML form of this size: a unit string when exact (`"2GiB"`), else an integer; a
    /// percentage (`"80%"`) when exact, else a float. Always reads back to an equal size.
    pub fn to_toml(&self) -> toml::Value {
        match *self {
            Size::Bytes(n) => match (unit_form(n), i64::try_from(n)) {
                (Some(text), _) => toml::Value::String(text),
                (None, Ok(i)) => toml::Value::Integer(i),
                (None, Err(_)) => toml::Value::String(n.to_string()),
            },
            // "80%" when that text reads back exactly, else the float itself.
            Size::Fraction(f) => {
                let percent = format!("{}%", f * 100.0);
                match percent.parse() {
                    Ok(Size::Fraction(back)) if back == f => toml::Value::String(percent),
                    _ => toml::Value::Float(f),
                }
            }
        }
    }
}

/// A size written as a float (`0.5`, in TOML or as text): a fraction of device memory.
fn float(f: f64) -> Result<Size, ParseSizeError> {
    if f.is_finite() && f > 1.0 && f.fract() == 0.0 {
        Err(ParseSizeError::WholeFloat)
    } else {
        fraction(f)
    }
}

fn fraction(f: f64) -> Result<Size, ParseSizeError> {
    if !f.is_finite() {
        Err(ParseSizeError::Malformed)
    } else if f < 0.0 {
        Err(ParseSizeError::Negative)
    } else if f == 0.0 {
        Err(ParseSizeError::Zero)
    } else if f > 1.0 {
        Err(ParseSizeError::FractionAboveWhole)
    } else {
        Ok(Size::Fraction(f))
    }
}

/// `n` with the unit that divides it exactly and leaves the smallest number (`50GB`, not
/// `48828125KiB`); binary units win ties.
pub(crate) fn unit_form(n: u64) -> Option<String> {
    unit_parts(n).map(|(count, name)| format!("{count}{name}"))
}

fn unit_parts(n: u64) -> Option<(u64, &'static str)> {
    const SHOWN: &[(&str, u64)] = &[
        ("PiB", PIB),
        ("TiB", TIB),
        ("GiB", GIB),
        ("MiB", MIB),
        ("KiB", KIB),
        ("PB", 1_000_000_000_000_000),
        ("TB", 1_000_000_000_000),
        ("GB", 1_000_000_000),
        ("MB", 1_000_000),
        ("kB", 1_000),
    ];
    SHOWN
        .iter()
        .filter(|(_, unit)| n >= *unit && n.is_multiple_of(*unit))
        .min_by_key(|(_, unit)| n / unit)
        .map(|(name, unit)| (n / unit, *name))
}

impl FromStr for Size {
    type Err = ParseSizeError;

    fn from_str(text: &str) -> Result<Size, ParseSizeError> {
        let text = text.trim();
        let (negative, body) = match text.strip_prefix('-') {
            Some(rest) => (true, rest.trim_start()),
            None => (false, text),
        };
        let number_len = body
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(body.len());
        let (number, unit) = body.split_at(number_len);
        let unit = unit.trim().to_ascii_lowercase();
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let well_formed = !number.is_empty()
            && number != "."
            && !frac_part.contains('.')
            && (unit.is_empty() || unit == "%" || UNITS.iter().any(|(u, _)| *u == unit));
        if !well_formed {
            return Err(ParseSizeError::Malformed);
        }
        if negative {
            return Err(ParseSizeError::Negative);
        }
        let has_point = number.contains('.');
        match unit.as_str() {
            "%" => fraction(parse_f64(number)? / 100.0),
            "" if has_point => float(parse_f64(number)?),
            unit => {
                let scale = UNITS
                    .iter()
                    .find(|(u, _)| *u == unit)
                    .map_or(1, |(_, scale)| *scale);
                bytes(int_part, frac_part, scale)
            }
        }
    }
}

fn parse_f64(number: &str) -> Result<f64, ParseSizeError> {
    number.parse().map_err(|_| ParseSizeError::Malformed)
}

/// `int.frac × scale` in exact integer arithmetic, truncated to whole bytes.
fn bytes(int_part: &str, frac_part: &str, scale: u64) -> Result<Size, ParseSizeError> {
    // More than 20 integer digits is above u64::MAX whatever the unit; fractional digits past
    // the 18th are worth less than a byte even in PiB, so they are dropped.
    if int_part.trim_start_matches('0').len() > 20 {
        return Err(ParseSizeError::Overflow);
    }
    let frac_part = &frac_part[..frac_part.len().min(18)];
    let digits = format!("{int_part}{frac_part}");
    let mantissa: u128 = digits.parse().map_err(|_| ParseSizeError::Malformed)?;
    let divisor = 10u128.pow(frac_part.len() as u32);
    let n = mantissa
        .checked_mul(u128::from(scale))
        .ok_or(ParseSizeError::Overflow)?
        / divisor;
    match u64::try_from(n) {
        Ok(0) => Err(ParseSizeError::Zero),
        Ok(n) => Ok(Size::Bytes(n)),
        Err(_) => Err(ParseSizeError::Overflow),
    }
}

impl fmt::Display for Size {
    /// `2GiB`, `1500MB`, `1000` (bytes) or `50%`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Size::Bytes(n) => match unit_form(n) {
                Some(text) => f.write_str(&text),
                None => write!(f, "{n}"),
            },
            Size::Fraction(x) => {
                let percent = format!("{:.4}", x * 100.0);
                let percent = percent.trim_end_matches('0').trim_end_matches('.');
                write!(f, "{percent}%")
            }
        }
    }
}

/// `TryFrom<toml::Value>` (by `parse`) and `From<$ty> for toml::Value` (by `write`), each
/// given a reference, which `#[serde(try_from = "toml::Value", into = "toml::Value")]` needs.
macro_rules! toml_value_conversions {
    ($ty:ty, $error:ty, $parse:expr, $write:expr) => {
        impl TryFrom<toml::Value> for $ty {
            type Error = $error;

            fn try_from(value: toml::Value) -> Result<$ty, $error> {
                ($parse)(&value)
            }
        }

        impl From<$ty> for toml::Value {
            fn from(value: $ty) -> toml::Value {
                ($write)(&value)
            }
        }
    };
}
pub(crate) use toml_value_conversions;

toml_value_conversions!(Size, ParseSizeError, Size::from_toml, Size::to_toml);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{Error, Setting};

    #[test]
    fn parses_every_form() {
        let cases = [
            ("1073741824", Size::Bytes(GIB)),
            ("2GiB", Size::Bytes(2 * GIB)),
            ("2 gib", Size::Bytes(2 * GIB)),
            ("512MB", Size::Bytes(512_000_000)),
            ("1.5 GB", Size::Bytes(1_500_000_000)),
            ("1.5GiB", Size::Bytes(3 * GIB / 2)),
            ("100B", Size::Bytes(100)),
            ("50%", Size::Fraction(0.5)),
            ("12.5%", Size::Fraction(0.125)),
            ("0.5", Size::Fraction(0.5)),
            ("1.0", Size::Fraction(1.0)),
            ("16383PiB", Size::Bytes(16383 * PIB)),
            ("1.0000000000000000000001GiB", Size::Bytes(GIB)),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Size>(), Ok(want), "{text}");
        }
    }

    #[test]
    fn rejects_bad_sizes_with_the_reason() {
        use ParseSizeError::*;
        let cases = [
            ("2GB0", Malformed),
            ("x", Malformed),
            ("", Malformed),
            ("2G", Malformed),
            ("1.2.3", Malformed),
            ("-1GiB", Negative),
            ("-0.5", Negative),
            ("0", Zero),
            ("0%", Zero),
            ("0.1B", Zero),
            ("0.0000000000000000001GiB", Zero),
            ("150%", FractionAboveWhole),
            ("200%", FractionAboveWhole),
            ("1.5", FractionAboveWhole),
            ("2.0", WholeFloat),
            ("9223372036854775808.0", WholeFloat),
            ("99999999999PB", Overflow),
            ("16384PiB", Overflow),
        ];
        for (text, want) in cases {
            assert_eq!(text.parse::<Size>(), Err(want), "{text}");
        }
    }

    #[test]
    fn toml_values() {
        use toml::Value::*;
        assert_eq!(Size::from_toml(&Integer(4096)), Ok(Size::Bytes(4096)));
        assert_eq!(Size::from_toml(&Float(0.25)), Ok(Size::Fraction(0.25)));
        assert_eq!(Size::from_toml(&Integer(-1)), Err(ParseSizeError::Negative));
        assert_eq!(Size::from_toml(&Integer(0)), Err(ParseSizeError::Zero));
        assert_eq!(
            Size::from_toml(&Float(1.5)),
            Err(ParseSizeError::FractionAboveWhole)
        );
        // 2^63 bytes or more, having gone through a float, is not called a fraction.
        for bytes in [8e9, 9_223_372_036_854_775_808.0, 1e300] {
            let err = Size::from_toml(&Float(bytes)).unwrap_err();
            assert_eq!(err, ParseSizeError::WholeFloat, "{bytes}");
            assert!(!err.to_string().contains("cannot exceed 100%"), "{err}");
        }
        assert_eq!(
            Size::from_toml(&Float(f64::NAN)),
            Err(ParseSizeError::Malformed)
        );
        assert_eq!(
            Size::from_toml(&Boolean(true)),
            Err(ParseSizeError::Malformed)
        );
    }

    #[test]
    fn resolves_rounding_down_to_256() {
        assert_eq!(Size::Bytes(1000).resolve(0), 768);
        assert_eq!(Size::Bytes(255).resolve(0), 0);
        assert_eq!(Size::Fraction(0.5).resolve(80 * GIB), 40 * GIB);
        assert_eq!(Size::Fraction(0.5).resolve(1001), 256);
        assert_eq!(Size::Fraction(1.0).resolve(u64::MAX), align_down(u64::MAX));
    }

    #[test]
    fn a_device_size_is_refused_when_larger_than_the_device_or_zero_once_rounded() {
        let setting = || Setting {
            key: "spill.device_memory_limit".into(),
            value: "1PB".into(),
            origin: crate::Source::Code,
        };
        let pb = Size::Bytes(1_000_000_000_000_000);
        let err = pb
            .resolve_on_device(3, 80 * GIB, true, setting)
            .unwrap_err();
        assert!(
            matches!(err, Error::LargerThanDevice { device: 3, .. }),
            "{err}"
        );
        let text = err.to_string();
        for part in [
            "spill.device_memory_limit = 1PB (code)",
            "device 3's 80GiB",
            "90%",
        ] {
            assert!(text.contains(part), "{part}: {text}");
        }
        // Sizes of host memory are not bound by the device.
        assert_eq!(
            pb.resolve_on_device(3, 80 * GIB, false, setting).unwrap(),
            align_down(1_000_000_000_000_000)
        );
        assert_eq!(
            Size::Fraction(1.0)
                .resolve_on_device(0, 80 * GIB, true, setting)
                .unwrap(),
            80 * GIB
        );
        let err = Size::Bytes(100).resolve_on_device(0, GIB, true, setting);
        assert!(
            matches!(err, Err(Error::RoundsToZero { device: 0, .. })),
            "{err:?}"
        );
    }

    #[test]
    fn display_and_toml_form_round_trip() {
        for size in [
            Size::Bytes(2 * GIB),
            Size::Bytes(1_500_000_000),
            Size::Bytes(1000),
            Size::Bytes(1001),
            Size::Bytes(u64::MAX),
            Size::Fraction(0.5),
            Size::Fraction(0.3),
            Size::Fraction(1.0 / 3.0),
        ] {
            assert_eq!(Size::from_toml(&size.to_toml()), Ok(size), "{size}");
        }
        assert_eq!(Size::Bytes(2 * GIB).to_string(), "2GiB");
        assert_eq!(Size::Bytes(1_500_000_000).to_string(), "1500MB");
        assert_eq!(Size::Bytes(1001).to_string(), "1001");
        assert_eq!(Size::Bytes(50_000_000_000).to_string(), "50GB");
        assert_eq!(Size::Bytes(1_024_000).to_string(), "1000KiB");
        assert_eq!(Size::Fraction(0.3).to_string(), "30%");
        assert_eq!(Size::Fraction(0.125).to_string(), "12.5%");
        assert_eq!(
            Size::Fraction(0.8).to_toml(),
            toml::Value::String("80%".into())
        );
    }
}
