//! Writing what a job printed to the operator's terminal.
//!
//! A job's output is its own business, and it may hold escape sequences that take a terminal
//! over: an OSC 52 clipboard write, a new window title, a cleared screen, a cursor moved up to
//! hide a line. On a terminal, `ax instance logs` writes every control character but newline and
//! tab visibly (`\x1b`, `\u{9b}`), as journalctl does; `--raw`, or output to a pipe or a file,
//! passes the bytes as written.

use std::io::Write;

/// Where a log's bytes go: stdout, neutralised or raw.
pub(crate) struct Screen {
    raw: bool,
    /// The start of a character cut at the end of the last write.
    pending: Vec<u8>,
}

impl Screen {
    /// Stdout, raw when `raw` is asked or stdout is no terminal.
    pub(crate) fn stdout(raw: bool) -> Self {
        use std::io::IsTerminal;
        Self {
            raw: raw || !std::io::stdout().is_terminal(),
            pending: Vec::new(),
        }
    }

    /// Writes `data` (a piece of a log) and flushes.
    pub(crate) fn write(&mut self, data: &[u8]) {
        let mut out = std::io::stdout().lock();
        if self.raw {
            let _ = out.write_all(data);
        } else {
            let _ = out.write_all(self.neutralised(data).as_bytes());
        }
        let _ = out.flush();
    }

    /// `data` with its control characters written visibly; a character cut at its end waits
    /// for the next piece.
    fn neutralised(&mut self, data: &[u8]) -> String {
        let mut bytes = std::mem::take(&mut self.pending);
        bytes.extend_from_slice(data);
        let whole = match std::str::from_utf8(&bytes) {
            Err(e) if e.error_len().is_none() => e.valid_up_to(),
            _ => bytes.len(),
        };
        self.pending = bytes.split_off(whole);
        visible(&String::from_utf8_lossy(&bytes))
    }
}

/// `text` with every control character but newline and tab written as an escape.
fn visible(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let code = u32::from(c);
        match c {
            '\n' | '\t' => out.push(c),
            _ if code < 0x20 || code == 0x7f => out.push_str(&format!("\\x{code:02x}")),
            _ if (0x80..=0x9f).contains(&code) => out.push_str(&format!("\\u{{{code:x}}}")),
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_that_take_a_terminal_over_are_written_visibly() {
        // OSC 52 (clipboard), a window title, clear screen, a C1 CSI, a carriage return.
        let hostile = "a\x1b]52;c;ZXZpbA==\x07b\x1b]0;owned\x07\x1b[2J\u{9b}31m\rc\n\td\u{7f}é";
        assert_eq!(
            visible(hostile),
            "a\\x1b]52;c;ZXZpbA==\\x07b\\x1b]0;owned\\x07\\x1b[2J\\u{9b}31m\\x0dc\n\td\\x7fé"
        );
    }

    #[test]
    fn a_character_cut_between_two_pieces_is_written_whole() {
        let mut screen = Screen {
            raw: false,
            pending: Vec::new(),
        };
        let e_acute = "é".as_bytes();
        assert_eq!(screen.neutralised(&[b'x', e_acute[0]]), "x");
        assert_eq!(screen.neutralised(&[e_acute[1], b'\n']), "é\n");
        // An invalid byte is shown as such, never kept waiting.
        assert_eq!(screen.neutralised(&[0xff, b'y']), "\u{fffd}y");
    }
}
