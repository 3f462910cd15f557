//! Streaming text with stop strings: text that might be the start of a
//! stop string is held back until the next token settles it, so a client
//! never receives part of a stop string (OpenAI's stop strings are not
//! included in the output).

/// The generated text of one sequence and how much of it was sent.
#[derive(Clone, Debug, Default)]
pub struct StopText {
    text: String,
    sent: usize,
    stop: Vec<String>,
}

/// What one push produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pushed {
    /// Text to send now (may be empty).
    pub text: String,
    /// A stop string appeared: the sequence ends, `text` is the last piece.
    pub stopped: bool,
}

impl StopText {
    /// Text with these stop strings (empty ones are ignored).
    pub fn new(stop: Vec<String>) -> StopText {
        StopText {
            text: String::new(),
            sent: 0,
            stop: stop.into_iter().filter(|s| !s.is_empty()).collect(),
        }
    }

    /// Appends a decoded piece; returns what can be sent.
    pub fn push(&mut self, piece: &str) -> Pushed {
        self.text.push_str(piece);
        // Any match begins at or after `sent`: text before it was sent only
        // once no stop string could start there.
        let tail = &self.text[self.sent..];
        if let Some(cut) = self.stop.iter().filter_map(|s| tail.find(s.as_str())).min() {
            let end = self.sent + cut;
            let out = self.text[self.sent..end].to_string();
            self.text.truncate(end);
            self.sent = end;
            return Pushed {
                text: out,
                stopped: true,
            };
        }
        let hold = self
            .stop
            .iter()
            .map(|s| {
                // The longest proper prefix of `s` that ends the text.
                s.char_indices()
                    .map(|(i, _)| i)
                    .skip(1)
                    .filter(|&k| self.text.ends_with(&s[..k]))
                    .max()
                    .unwrap_or(0)
            })
            .max()
            .unwrap_or(0);
        let end = (self.text.len() - hold).max(self.sent);
        let out = self.text[self.sent..end].to_string();
        self.sent = end;
        Pushed {
            text: out,
            stopped: false,
        }
    }

    /// The held-back rest, when the sequence ends for another reason.
    pub fn flush(&mut self) -> String {
        let out = self.text[self.sent..].to_string();
        self.sent = self.text.len();
        out
    }

    /// All text so far (after a stop: up to the stop string).
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stop: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut t = StopText::new(stop.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let r = t.push(p);
            out.push(r.text);
            if r.stopped {
                return (out, true, t.text().to_string());
            }
        }
        out.push(t.flush());
        (out, false, t.text().to_string())
    }

    #[test]
    fn without_stops_everything_passes_at_once() {
        let (out, stopped, _) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b", ""]);
        assert!(!stopped);
    }

    #[test]
    fn a_stop_split_across_pieces_is_never_sent() {
        let (out, stopped, text) = run(&["\n\n"], &["Hi", "\n", "\nmore"]);
        assert_eq!(out, ["Hi", "", ""]);
        assert!(stopped);
        assert_eq!(text, "Hi");
    }

    #[test]
    fn a_false_start_is_released_by_the_next_piece() {
        let (out, stopped, text) = run(&["END"], &["a E", "N", "x", "y"]);
        assert_eq!(out, ["a ", "", "ENx", "y", ""]);
        assert!(!stopped);
        assert_eq!(text, "a ENxy");
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_prefixes_are_held() {
        let (out, stopped, text) = run(&["zz", "é!"], &["aé", "!zz"]);
        assert_eq!(out, ["a", ""]);
        assert!(stopped);
        assert_eq!(text, "a");
    }
}
