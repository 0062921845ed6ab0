//! RMM's CSV line, formatted without allocating: `Thread,Time,Action,Pointer,Size,Stream`.

use super::action::LogAction;

/// `"00"` to `"99"`.
pub(super) const DIGIT_PAIRS: [u8; 200] = {
    let mut t = [0u8; 200];
    let mut i = 0;
    while i < 100 {
        t[2 * i] = b'0' + (i / 10) as u8;
        t[2 * i + 1] = b'0' + (i % 10) as u8;
        i += 1;
    }
    t
};

/// A CSV line built on the stack: at most 21 (thread and comma) + 15 (time) + 18 (action and
/// commas) + 18 (pointer) + 21 (size and comma) + 19 (stream and newline) = 112 bytes.
pub(super) struct Line {
    pub(super) buf: [u8; 128],
    pub(super) len: usize,
}

impl Line {
    pub(super) fn new() -> Line {
        Line {
            buf: [0; 128],
            len: 0,
        }
    }

    pub(super) fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    #[inline]
    pub(super) fn bytes(&mut self, b: &[u8]) {
        self.buf[self.len..self.len + b.len()].copy_from_slice(b);
        self.len += b.len();
    }

    #[inline]
    pub(super) fn pair(&mut self, v: u64) {
        let i = 2 * v as usize;
        self.bytes(&DIGIT_PAIRS[i..i + 2]);
    }

    /// `v` in decimal.
    #[inline]
    pub(super) fn dec(&mut self, mut v: u64) {
        let mut tmp = [0u8; 20];
        let mut i = tmp.len();
        loop {
            let r = 2 * (v % 100) as usize;
            v /= 100;
            i -= 2;
            tmp[i..i + 2].copy_from_slice(&DIGIT_PAIRS[r..r + 2]);
            if v == 0 {
                break;
            }
        }
        // Without the first pair's leading zero (`05` of 105, one `0` of 0).
        self.bytes(&tmp[i + usize::from(tmp[i] == b'0')..]);
    }

    /// `v` as `{:#x}` writes it: `0x` and lower-case digits.
    #[inline]
    pub(super) fn hex(&mut self, v: u64) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        self.bytes(b"0x");
        let digits = (16 - v.leading_zeros() as usize / 4).max(1);
        for k in (0..digits).rev() {
            self.buf[self.len] = DIGITS[(v >> (4 * k)) as usize & 15];
            self.len += 1;
        }
    }

    /// `HH:MM:SS.ffffff` (UTC) of `ns` since the epoch; `second` caches the last `HH:MM:SS.`.
    #[inline]
    pub(super) fn time(&mut self, second: &mut (u64, [u8; 9]), ns: u64) {
        let secs = ns / 1_000_000_000;
        if second.0 != secs {
            let s = secs % 86_400;
            let two = |v: u64| [b'0' + (v / 10) as u8, b'0' + (v % 10) as u8];
            let (h, m, sec) = (two(s / 3600), two(s / 60 % 60), two(s % 60));
            *second = (
                secs,
                [h[0], h[1], b':', m[0], m[1], b':', sec[0], sec[1], b'.'],
            );
        }
        self.bytes(&second.1);
        let us = (ns % 1_000_000_000) / 1000;
        self.pair(us / 10_000);
        self.pair(us / 100 % 100);
        self.pair(us % 100);
    }
}

/// `<thread>,`: how a thread's lines start.
pub(super) fn line_prefix(thread: u64) -> Vec<u8> {
    let mut line = Line::new();
    line.dec(thread);
    line.bytes(b",");
    line.as_bytes().to_vec()
}

/// Appends one CSV line for `record`; `prefix` is [`line_prefix`] of its thread.
#[inline]
pub(super) fn format_line(
    out: &mut Vec<u8>,
    second: &mut (u64, [u8; 9]),
    prefix: &[u8],
    record: &[u64; 5],
) {
    let [tag, time, ptr, size, stream] = *record;
    let mut line = Line::new();
    line.bytes(prefix);
    line.time(second, time);
    let action = LogAction::ALL[(tag & 3).min(2) as usize];
    line.bytes(b",");
    line.bytes(action.as_str().as_bytes());
    line.bytes(b",");
    line.hex(ptr);
    line.bytes(b",");
    line.dec(size);
    line.bytes(b",");
    line.hex(stream);
    line.bytes(b"\n");
    out.extend_from_slice(line.as_bytes());
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    #[test]
    fn formats_as_rmm_does() {
        let mut out = Vec::new();
        let mut second = (u64::MAX, [0; 9]);
        // 1970-01-02 14:03:22.123456789
        let ns = ((86_400 + 14 * 3600 + 3 * 60 + 22) * 1_000_000_000) + 123_456_789;
        format_line(
            &mut out,
            &mut second,
            &line_prefix(140204),
            &[
                5 << 2 | LogAction::Allocate as u64,
                ns,
                0x7f5a2c000000,
                1048576,
                0,
            ],
        );
        format_line(
            &mut out,
            &mut second,
            &line_prefix(7),
            &[
                6 << 2 | LogAction::AllocateFailure as u64,
                ns + 1_000,
                0,
                85899345920,
                0x5581e2c0,
            ],
        );
        format_line(
            &mut out,
            &mut second,
            &line_prefix(0),
            &[7 << 2 | LogAction::Free as u64, 59, u64::MAX, 0, 1],
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "140204,14:03:22.123456,allocate,0x7f5a2c000000,1048576,0x0\n\
             7,14:03:22.123457,allocate failure,0x0,85899345920,0x5581e2c0\n\
             0,00:00:00.000000,free,0xffffffffffffffff,0,0x1\n"
        );
    }

    #[test]
    fn numbers_format_as_std_does() {
        let mut values = vec![0, 1, 9, 10, 15, 16, 99, 100, 101, 255, 256, 999, 1000, 4095];
        values.extend([
            u64::MAX,
            u64::MAX - 1,
            1 << 63,
            0x7f5a_2c00_0000,
            85_899_345_920,
        ]);
        values.extend((0..64).map(|b| 1u64 << b));
        values.extend((1..20).map(|e| 10u64.pow(e) - 1));
        for v in values {
            let mut line = Line::new();
            line.dec(v);
            line.bytes(b" ");
            line.hex(v);
            assert_eq!(
                std::str::from_utf8(line.as_bytes()).unwrap(),
                format!("{v} {v:#x}")
            );
        }
        let mut second = (u64::MAX, [0; 9]);
        for us in [0u64, 1, 9, 10, 99, 100, 999_999, 123_456] {
            let mut line = Line::new();
            line.time(&mut second, (86_399 * 1_000_000 + us) * 1000 + 999);
            assert_eq!(
                std::str::from_utf8(line.as_bytes()).unwrap(),
                format!("23:59:59.{us:06}")
            );
        }
    }
}
