//! A progress bar on a terminal; plain stderr lines otherwise (CI logs, pipes).

use indicatif::{ProgressBar, ProgressStyle};
use std::io::IsTerminal;

/// One line on stderr. Unlike `eprintln!`, a closed terminal (SIGHUP) is not a panic: the
/// cleanup that follows an interrupt must still run to its end.
pub fn say(line: &str) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = writeln!(e, "{line}");
}

pub struct Progress(Option<ProgressBar>);

impl Progress {
    pub fn new(total: u64) -> Progress {
        if !std::io::stderr().is_terminal() {
            return Progress(None);
        }
        let b = ProgressBar::new(total);
        b.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        Progress(Some(b))
    }

    /// Names the run that starts now.
    pub fn start(&self, what: &str) {
        if let Some(b) = &self.0 {
            b.set_message(what.to_string());
        }
    }

    pub fn done_one(&self) {
        if let Some(b) = &self.0 {
            b.inc(1);
        }
    }

    /// Starts phase `name` of `total` steps, `done` of them done (fsck's phases, crashtest's
    /// families).
    pub fn phase_at(&self, name: &str, done: u64, total: u64) {
        if let Some(b) = &self.0 {
            b.set_message(name.to_string());
            b.set_length(total);
            b.set_position(done);
        }
    }

    /// Steps done so far in the current phase.
    pub fn set(&self, done: u64) {
        if let Some(b) = &self.0 {
            b.set_position(done);
        }
    }

    /// A line of the command's output on stdout, the bar held back while it is printed.
    pub fn stdout(&self, line: &str) {
        match &self.0 {
            Some(b) => b.suspend(|| println!("{line}")),
            None => println!("{line}"),
        }
    }

    /// A line for the user that must not be overdrawn by the bar.
    pub fn note(&self, line: &str) {
        match &self.0 {
            Some(b) => b.println(line),
            None => say(line),
        }
    }

    pub fn finish(&self) {
        if let Some(b) = &self.0 {
            b.finish_and_clear();
        }
    }
}
