//! Where a placeholder stands in a shell command: how `/bin/sh` will read the text around it,
//! so that [`super::template`] quotes the variable reference it puts there for that spot.
//!
//! Quotes alone are not enough to tell: a quote inside a comment (`# don't`) or inside a
//! here-document is no quote at all, and a command substitution (`"$(echo ...)"`) starts a
//! fresh, unquoted context inside double quotes. Reading those as quotes once made a value
//! be split into words and globbed, or lost. The reader follows POSIX `sh`: backslash escapes,
//! single and double quotes, comments (a `#` starting a word), `$( )` and backquote command
//! substitutions (nested), and here-documents (`<<WORD`, `<<-WORD`; a quoted `WORD` means
//! the body is taken literally).

/// How a variable reference must be written at a spot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Spot {
    /// Outside quotes: in double quotes, so the value stays one word and is not globbed.
    Bare,
    /// Inside double quotes (or an unquoted here-document body, or a comment): as it is.
    Quoted,
    /// Inside single quotes: closed, the reference in double quotes, opened again.
    SingleQuoted,
    /// Inside a quoted here-document body: nothing is expanded there.
    Literal,
}

/// One level of what the shell is reading.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Context {
    /// Plain command text (the top level, or the inside of a `$( )`, counting its parentheses).
    Code {
        parens: u32,
    },
    /// Inside backquotes.
    Backquote,
    Single,
    Double,
    /// A comment, to the end of the line.
    Comment,
    /// A here-document's body, line by line, until its delimiter.
    Body(HereDoc),
}

/// A here-document announced by `<<`.
#[derive(Clone, Debug, PartialEq, Eq)]
struct HereDoc {
    delimiter: String,
    /// The delimiter was quoted: the body is literal.
    quoted: bool,
    /// `<<-`: leading tabs are stripped from the body's lines and the delimiter line.
    strip_tabs: bool,
}

/// The reader's state across the pieces of text between placeholders.
#[derive(Clone, Debug)]
pub(crate) struct Reader {
    stack: Vec<Context>,
    /// Here-documents announced on the current line, their bodies starting after it.
    pending: Vec<HereDoc>,
    /// The current line of a here-document body so far.
    line: String,
    /// Whether the next character starts a word.
    word_start: bool,
    /// A here-document operator read so far (`<<`, then its delimiter word).
    operator: Option<Operator>,
}

#[derive(Clone, Debug, Default)]
struct Operator {
    strip_tabs: bool,
    word: String,
    quoted: bool,
    /// Still skipping blanks before the word.
    before_word: bool,
    /// Inside a quote of the word.
    quote: Option<char>,
}

impl Default for Reader {
    fn default() -> Self {
        Self {
            stack: vec![Context::Code { parens: 0 }],
            pending: Vec::new(),
            line: String::new(),
            word_start: true,
            operator: None,
        }
    }
}

impl Reader {
    /// How a reference is written at the current spot; a placeholder there is part of a word.
    pub(crate) fn placeholder(&mut self) -> Spot {
        self.word_start = false;
        if let Some(op) = &mut self.operator {
            // A placeholder in a here-document's delimiter: it never matches a line.
            op.word.push('\u{0}');
            op.before_word = false;
        }
        match self.stack.last() {
            Some(Context::Single) => Spot::SingleQuoted,
            Some(Context::Double) | Some(Context::Comment) => Spot::Quoted,
            Some(Context::Body(doc)) => {
                self.line.push('\u{0}');
                if doc.quoted {
                    Spot::Literal
                } else {
                    Spot::Quoted
                }
            }
            _ => Spot::Bare,
        }
    }

    /// Reads `text`.
    pub(crate) fn read(&mut self, text: &str) {
        let chars: Vec<char> = text.chars().collect();
        let mut i = 0;
        while i < chars.len() {
            i += self.step(&chars[i..]);
        }
    }

    /// Reads the start of `rest`; returns how many characters it took.
    fn step(&mut self, rest: &[char]) -> usize {
        let c = rest[0];
        let next = rest.get(1).copied();
        if self.operator.is_some() {
            return self.operator_char(c);
        }
        let top = self
            .stack
            .last()
            .cloned()
            .unwrap_or(Context::Code { parens: 0 });
        match top {
            Context::Body(doc) => {
                self.body_char(c, &doc);
                1
            }
            Context::Comment => {
                if c == '\n' {
                    self.stack.pop();
                    self.word_start = true;
                    self.newline();
                }
                1
            }
            Context::Single => {
                if c == '\'' {
                    self.stack.pop();
                }
                1
            }
            Context::Double => match c {
                '\\' => 2,
                '"' => {
                    self.stack.pop();
                    1
                }
                '$' if next == Some('(') => {
                    self.stack.push(Context::Code { parens: 0 });
                    self.word_start = true;
                    2
                }
                '`' => {
                    self.stack.push(Context::Backquote);
                    self.word_start = true;
                    1
                }
                _ => 1,
            },
            Context::Backquote if c == '`' => {
                self.stack.pop();
                self.word_start = false;
                1
            }
            Context::Code { .. } | Context::Backquote => self.code_char(c, next),
        }
    }

    /// A character of plain command text.
    fn code_char(&mut self, c: char, next: Option<char>) -> usize {
        let word_start = std::mem::replace(&mut self.word_start, false);
        match c {
            '\\' => 2,
            '\'' => {
                self.stack.push(Context::Single);
                1
            }
            '"' => {
                self.stack.push(Context::Double);
                1
            }
            '`' => {
                self.stack.push(Context::Backquote);
                self.word_start = true;
                1
            }
            '#' if word_start => {
                self.stack.push(Context::Comment);
                1
            }
            '$' if next == Some('(') => {
                self.stack.push(Context::Code { parens: 0 });
                self.word_start = true;
                2
            }
            '(' => {
                if let Some(Context::Code { parens }) = self.stack.last_mut() {
                    *parens += 1;
                }
                self.word_start = true;
                1
            }
            ')' => {
                let depth = self.stack.len();
                match self.stack.last_mut() {
                    Some(Context::Code { parens }) if *parens > 0 => *parens -= 1,
                    // The end of a `$( )`; the top level never closes.
                    Some(Context::Code { .. }) if depth > 1 => {
                        self.stack.pop();
                    }
                    _ => {}
                }
                self.word_start = true;
                1
            }
            '<' if next == Some('<') => {
                self.operator = Some(Operator {
                    before_word: true,
                    ..Operator::default()
                });
                2
            }
            '\n' => {
                self.word_start = true;
                self.newline();
                1
            }
            ' ' | '\t' | ';' | '&' | '|' => {
                self.word_start = true;
                1
            }
            _ => 1,
        }
    }

    /// A character after `<<`: an optional `-`, blanks, then the delimiter word.
    fn operator_char(&mut self, c: char) -> usize {
        let Some(op) = &mut self.operator else {
            return 1;
        };
        if let Some(quote) = op.quote {
            if c == quote {
                op.quote = None;
            } else {
                op.word.push(c);
            }
            return 1;
        }
        if op.before_word {
            match c {
                '-' if op.word.is_empty() && !op.strip_tabs => {
                    op.strip_tabs = true;
                    return 1;
                }
                ' ' | '\t' => return 1,
                _ => op.before_word = false,
            }
        }
        match c {
            '\'' | '"' => {
                op.quoted = true;
                op.quote = Some(c);
                1
            }
            '\\' => {
                op.quoted = true;
                1
            }
            c if c.is_whitespace() || ";&|<>()".contains(c) => {
                let op = self.operator.take().unwrap_or_default();
                if !op.word.is_empty() {
                    self.pending.push(HereDoc {
                        delimiter: op.word,
                        quoted: op.quoted,
                        strip_tabs: op.strip_tabs,
                    });
                }
                // The character ends the word and is read as code.
                0
            }
            c => {
                op.word.push(c);
                1
            }
        }
    }

    /// The end of a line of code: the bodies of the here-documents announced on it start.
    fn newline(&mut self) {
        if !self.pending.is_empty() {
            let doc = self.pending.remove(0);
            self.line.clear();
            self.stack.push(Context::Body(doc));
        }
    }

    /// A character of a here-document's body.
    fn body_char(&mut self, c: char, doc: &HereDoc) {
        if c != '\n' {
            self.line.push(c);
            return;
        }
        let line = if doc.strip_tabs {
            self.line.trim_start_matches('\t')
        } else {
            self.line.as_str()
        };
        if line == doc.delimiter {
            self.stack.pop();
            self.word_start = true;
            self.newline();
        }
        self.line.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spot after reading `text`.
    fn spot(text: &str) -> Spot {
        let mut reader = Reader::default();
        reader.read(text);
        reader.placeholder()
    }

    #[test]
    fn quotes_and_escapes() {
        assert_eq!(spot("echo "), Spot::Bare);
        assert_eq!(spot("echo \""), Spot::Quoted);
        assert_eq!(spot("echo '"), Spot::SingleQuoted);
        assert_eq!(spot("echo \\\""), Spot::Bare);
        assert_eq!(spot("echo \"a\\\"b"), Spot::Quoted);
        assert_eq!(
            spot("echo 'a\\'"),
            Spot::Bare,
            "no escape inside single quotes"
        );
    }

    #[test]
    fn a_quote_in_a_comment_is_no_quote() {
        assert_eq!(spot("# say \"hi\necho "), Spot::Bare);
        assert_eq!(spot("# don't\necho "), Spot::Bare);
        assert_eq!(spot("echo a # it's\necho "), Spot::Bare);
        // Not a comment: `#` inside a word.
        assert_eq!(spot("echo a#'"), Spot::SingleQuoted);
        assert_eq!(spot("echo $#'"), Spot::SingleQuoted);
    }

    #[test]
    fn a_command_substitution_is_read_afresh_inside_double_quotes() {
        assert_eq!(spot("echo \"$(printf %s "), Spot::Bare);
        assert_eq!(spot("echo \"$(printf %s \"x\") "), Spot::Quoted);
        assert_eq!(spot("echo \"$(f (a) "), Spot::Bare);
        assert_eq!(spot("echo \"`printf %s "), Spot::Bare);
        assert_eq!(spot("echo \"`printf` "), Spot::Quoted);
        assert_eq!(spot("x=$(echo '"), Spot::SingleQuoted);
    }

    #[test]
    fn here_documents_are_bodies_not_code() {
        assert_eq!(spot("cat <<EOF\nsay \"hi\n"), Spot::Quoted);
        assert_eq!(spot("cat <<EOF\nit's\nEOF\necho "), Spot::Bare);
        assert_eq!(spot("cat <<'EOF'\nx "), Spot::Literal);
        assert_eq!(spot("cat << \"END\"; echo a\nbody\n"), Spot::Literal);
        assert_eq!(spot("cat <<-EOF\n\tit's\n\tEOF\necho "), Spot::Bare);
        assert_eq!(spot("cat <<EOF\nEOF2\n"), Spot::Quoted, "not the delimiter");
        // Two on one line: bodies one after the other.
        assert_eq!(spot("cat <<A <<'B'\na\nA\n"), Spot::Literal);
        assert_eq!(spot("cat <<A <<'B'\na\nA\nb\nB\necho "), Spot::Bare);
    }
}
