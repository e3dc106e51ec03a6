//! The system log, for the detached daemon: its stdio is /dev/null, so a warning an operator
//! must see (a stuck request) goes to syslog, which journald keeps. This is the one module of
//! the crate that calls C directly; the calls need `unsafe` and nothing else here does.
#![allow(unsafe_code)]

use std::ffi::CString;

/// Names this process's lines `lanefs[PID]`, facility daemon.
pub fn open() {
    // SAFETY: openlog keeps the ident pointer for the life of the process; a C string literal
    // is static. The other arguments are plain integers.
    unsafe { libc::openlog(c"lanefs".as_ptr(), libc::LOG_PID, libc::LOG_DAEMON) }
}

/// Logs one line at level warning.
pub fn warning(msg: &str) {
    log(libc::LOG_WARNING, msg)
}

/// Logs one line at level info.
pub fn info(msg: &str) {
    log(libc::LOG_INFO, msg)
}

fn log(level: libc::c_int, msg: &str) {
    // A NUL would end the C string early; none of our messages has one, but a path might.
    let Ok(msg) = CString::new(msg.replace('\0', "\\0")) else { return };
    // SAFETY: "%s" consumes exactly the one argument given, a NUL-terminated string that lives
    // across the call; the message is never used as the format, so a '%' in it is harmless.
    unsafe { libc::syslog(level, c"%s".as_ptr(), msg.as_ptr()) }
}
