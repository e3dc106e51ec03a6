//! `lanefs bench`: arguments and the command itself. The `lanefs` binary flattens
//! [`BenchArgs`] into its `bench` subcommand and calls [`run`].

use crate::compare::{LanefsList, Reference, Setup};
use crate::fill::{Filled, MAX_FILL};
use crate::plot::{plot, Point};
use crate::progress::{say, Progress};
use crate::report::{json_line, markdown_table, Machine};
use crate::runner::{install_signal_handlers, interrupted, RunConfig};
use crate::session::{
    aggregate, compare_table, ratio_table, requests_table, run_matrix, Cell, Entry, Matrix, Role,
};
use crate::target::{open_target_with, Target, TargetOptions, TargetSpec};
use crate::workload::WorkloadList;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `lanefs bench`.
#[derive(clap::Args, Clone, Debug)]
pub struct BenchArgs {
    /// What to measure: dir:PATH (any directory: ext4, xfs, btrfs, tmpfs, a FUSE mount),
    /// lib:IMAGE (lanefs library) or mount:IMAGE (lanefs through FUSE). Repeatable; with
    /// --compare, extra targets measured against the references.
    #[arg(long = "target", value_name = "TARGET")]
    pub targets: Vec<TargetSpec>,
    /// Workloads, comma-separated: DWOL DWOM DWAL DWSL DRBL DRBM MRPL MRPM MRDL MRDM MWCL MWCM
    /// MWUL MWUM MWRL MWRM varmail fileserver oltp untar, or the groups all, fxmark, filebench,
    /// programs (untar, fileserver).
    #[arg(long, value_name = "W[,W...]", default_value = "all")]
    pub workload: WorkloadList,
    /// Thread counts, comma-separated.
    #[arg(long, value_name = "N[,N...]", value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Timed seconds of each run.
    #[arg(long, value_name = "S", default_value_t = 2.0)]
    pub seconds: f64,
    /// Untimed warm-up seconds before each run [default: a quarter of --seconds, 0.05 to 2].
    #[arg(long, value_name = "S")]
    pub warmup: Option<f64>,
    /// Write one JSON object per run to FILE (replaced); "-" prints them on stdout instead of
    /// the table.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Draw ops/s against threads, one panel per workload, into a PNG file.
    #[arg(long, value_name = "FILE.png")]
    pub plot: Option<PathBuf>,
    /// Set up the reference file systems (ext4, xfs, btrfs on loop devices over /dev/shm,
    /// tmpfs, bindfs over tmpfs; needs root), run all targets interleaved, remove them again.
    #[arg(long)]
    pub compare: bool,
    /// Directory for the image files of --compare (the references' loop devices and the lanefs
    /// rows): RAM by default; a directory on a disk compares the file systems on that disk.
    #[arg(long, value_name = "DIR", default_value = "/dev/shm", requires = "compare")]
    pub images_in: PathBuf,
    /// References for --compare.
    #[arg(
        long,
        value_name = "R[,R...]",
        value_delimiter = ',',
        default_value = "ext4,xfs,btrfs,tmpfs,bindfs"
    )]
    pub references: Vec<Reference>,
    /// lanefs rows of --compare, each on a fresh image (in --images-in) removed afterwards: lib
    /// (the library, in process), mount (through FUSE), both, or none.
    #[arg(long, value_name = "lib,mount|none", default_value = "lib,mount")]
    pub lanefs: LanefsList,
    /// Rounds: every target runs every cell once per round [default: 3 with --compare, else 1].
    #[arg(long, value_name = "N")]
    pub rounds: Option<u32>,
    /// Before the runs, fill each target with filler files (in lanefs-bench-fill/, removed
    /// afterwards) until this fraction of its capacity is in use, counting what is in use
    /// already: 0 (default) writes nothing, at most 0.97.
    #[arg(long, value_name = "F", default_value_t = 0.0)]
    pub fill: f64,
    /// Page cache of lib: targets (e.g. 16M; dirty pages beyond half of it are written back)
    /// [default: lanefs's own, 256M].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub lib_cache: Option<u64>,
    /// Persistent-memory region for the lib: target given with --target (lanefs's `--nvm`:
    /// the NAT and the lane journals in the region, created on first use and bound to that
    /// image). For mount: targets, put `--nvm FILE` in $LANEFS_MOUNT_OPTIONS.
    #[arg(long, value_name = "FILE")]
    pub nvm: Option<PathBuf>,
    /// With --nvm: fsyncs of at most N dirty pages log the pages inline in the region instead
    /// of writing data blocks (lanefs's `FsOptions::nvm_inline_pages`; 0: never; default:
    /// lanefs's choice, 4 unless the image is in RAM, then 0). The row is labelled
    /// `lib:IMAGE+nvm-inlineN` when given.
    #[arg(long, value_name = "N", requires = "nvm")]
    pub nvm_inline: Option<usize>,
    /// Cooperative checkpoint installs and commit of the lib: targets given with --target
    /// (lanefs's `FsOptions::cooperative`): on, off (rows labelled `+nocoop`), or both (each lib: target
    /// also runs with them off, on the image IMAGE-nocoop, interleaved with it). For mount:
    /// targets, put `-o cooperative=off` in $LANEFS_MOUNT_OPTIONS.
    #[arg(long, value_name = "on|off|both", default_value = "on", value_parser = ["on", "off", "both"])]
    pub cooperative: String,
    /// Fraction of the default file-set sizes (smoke runs only).
    #[arg(long, value_name = "F", default_value_t = 1.0, hide = true)]
    pub scale: f64,
}

impl BenchArgs {
    /// Checks what clap cannot; one line per problem.
    pub fn validate(&self) -> Result<(), String> {
        if !self.compare && self.targets.is_empty() {
            return Err("give --target dir:PATH (or lib:IMAGE, mount:IMAGE), or --compare".into());
        }
        if self.threads.is_empty() || self.threads.iter().any(|&t| t == 0 || t > 1024) {
            return Err("--threads takes counts from 1 to 1024".into());
        }
        if !(self.seconds.is_finite() && self.seconds > 0.0 && self.seconds <= 86_400.0) {
            return Err("--seconds must be above 0 (and at most a day)".into());
        }
        if let Some(w) = self.warmup {
            if !(w.is_finite() && (0.0..=3600.0).contains(&w)) {
                return Err("--warmup must be between 0 and 3600 seconds".into());
            }
        }
        if !(self.scale.is_finite() && self.scale > 0.0 && self.scale <= 100.0) {
            return Err("--scale must be above 0 and at most 100".into());
        }
        if !(self.fill.is_finite() && (0.0..=MAX_FILL).contains(&self.fill)) {
            return Err(format!("--fill must be a fraction from 0 to {MAX_FILL} (e.g. 0.8 for 80 % in use)"));
        }
        if self.lib_cache.is_some_and(|c| c < 1 << 20) {
            return Err("--lib-cache must be at least 1M".into());
        }
        if self.nvm.is_some() && self.targets.iter().filter(|t| matches!(t, TargetSpec::Lib(_))).count() != 1
        {
            return Err("--nvm takes exactly one lib: target (a region is bound to one image)".into());
        }
        if self.rounds == Some(0) {
            return Err("--rounds must be at least 1".into());
        }
        if let Some(p) = &self.plot {
            if !p.extension().is_some_and(|e| e.eq_ignore_ascii_case("png")) {
                return Err(format!("--plot {}: the file must end in .png", p.display()));
            }
        }
        Ok(())
    }

    fn matrix(&self) -> Matrix {
        let mut threads = self.threads.clone();
        threads.dedup();
        Matrix {
            workloads: self.workload.0.clone(),
            threads,
            rounds: self.rounds.unwrap_or(if self.compare { 3 } else { 1 }),
            cfg: RunConfig {
                seconds: self.seconds,
                warmup: self.warmup.unwrap_or_else(|| RunConfig::default_warmup(self.seconds)),
                scale: self.scale,
            },
        }
    }
}

/// A size with an optional binary unit: 512K, 16M, 1G; the grammar of every size option of the
/// `lanefs` command (`mkfs --size`, `--nvm-size`, `--lib-cache`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("'{s}' is not a size (try 16M, 4G)"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("'{s}': unknown unit '{unit}' (use K, M, G or T)")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("'{s}' is too large"))
}

/// Writes to stdout, ignoring failure: a closed terminal or a pipe closed by `head` must not turn
/// into a panic (the figures are in the JSON file when one was asked for).
fn emit(s: &str) {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(s.as_bytes()).and_then(|()| out.flush());
}

/// Where JSON lines go.
enum JsonOut {
    None,
    Stdout,
    File(std::fs::File, PathBuf),
}

/// `lanefs bench`. Errors are one line.
pub fn run(a: &BenchArgs) -> Result<(), String> {
    a.validate()?;
    install_signal_handlers()?;
    let machine = Machine::detect();
    let m = a.matrix();
    let mut json = match &a.json {
        None => JsonOut::None,
        Some(p) if p.as_os_str() == "-" => JsonOut::Stdout,
        Some(p) => {
            JsonOut::File(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?, p.clone())
        }
    };

    // Setup is declared before the entries so that it is dropped (and unmounts) after them.
    let mut setup: Option<Setup> = None;
    let mut notes: Vec<String> = Vec::new();
    let mut entries = if a.compare { compare_entries(a, &mut setup, &mut notes)? } else { Vec::new() };
    entries.extend(given_entries(a)?);
    if entries.is_empty() {
        return Err("no target to run: every reference was skipped".into());
    }
    if a.fill > 0.0 {
        entries = fill_entries(entries, a.fill)?;
    }

    let progress = Progress::new(m.runs(entries.len()));
    let mut sink = |round: u32, r: &crate::runner::RunResult| -> Result<(), String> {
        let line = json_line(r, &machine, a.compare.then_some(round)).to_string();
        match &mut json {
            JsonOut::None => Ok(()),
            JsonOut::Stdout => {
                emit(&format!("{line}\n"));
                Ok(())
            }
            JsonOut::File(f, p) => writeln!(f, "{line}").map_err(|e| format!("{}: {e}", p.display())),
        }
    };
    let outcome = run_matrix(&entries, &m, &progress, &mut sink);
    progress.finish();
    let outcome = outcome?;
    let cells = aggregate(&outcome.results);

    if !matches!(json, JsonOut::Stdout) && !outcome.results.is_empty() {
        if a.compare {
            report_compare(&entries, &cells, &m, &machine, &notes);
        } else {
            let runs: Vec<_> = outcome.results.iter().map(|(_, r)| r.clone()).collect();
            emit(&markdown_table(&runs));
        }
    }
    if let Some(p) = &a.plot {
        let points: Vec<Point> = cells
            .iter()
            .map(|c| Point {
                target: c.target.clone(),
                workload: c.workload,
                threads: c.threads,
                ops_per_sec: c.ops_per_sec,
            })
            .collect();
        if !points.is_empty() {
            plot(p, &points)?;
        }
    }

    // Unmount and detach now, so that a failure to do so is this command's error: the targets
    // first (a lanefs mount waits for its final checkpoint), then what the setup made for them.
    let mut errors: Vec<String> = entries.iter().filter_map(|e| e.target.close().err()).collect();
    drop(entries);
    if let Some(mut s) = setup.take() {
        errors.extend(s.cleanup());
    }
    if !errors.is_empty() {
        return Err(format!("cleanup incomplete: {}", errors.join("; ")));
    }
    if outcome.interrupted {
        return Err("interrupted; everything it set up was removed".into());
    }
    if let Some(first) = outcome.failures.first() {
        return Err(format!(
            "{} of {} runs failed; first: {first}",
            outcome.failures.len(),
            outcome.failures.len() + outcome.results.len()
        ));
    }
    Ok(())
}

/// The targets given with `--target`: subjects of a `--compare` run, else rows of their own.
fn given_entries(a: &BenchArgs) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    for spec in &a.targets {
        let role = if a.compare { Role::Subject } else { Role::Reference };
        let nvm = a.nvm.clone().filter(|_| matches!(spec, TargetSpec::Lib(_)));
        let label = match (&nvm, a.nvm_inline) {
            (Some(_), None) => format!("{spec}+nvm"),
            (Some(_), Some(n)) => format!("{spec}+nvm-inline{n}"),
            (None, _) => spec.to_string(),
        };
        let opts = TargetOptions {
            lib_cache: a.lib_cache,
            nvm,
            nvm_inline_pages: a.nvm_inline,
            no_cooperative: false,
        };
        let lib = matches!(spec, TargetSpec::Lib(_));
        if !lib || a.cooperative != "off" {
            entries.push(Entry { label: label.clone(), role, target: open_target_with(spec, &opts)? });
        }
        if lib && a.cooperative != "on" {
            let spec = match (spec, a.cooperative.as_str()) {
                (TargetSpec::Lib(p), "both") => {
                    let mut other = p.clone().into_os_string();
                    other.push("-nocoop");
                    TargetSpec::Lib(other.into())
                }
                _ => spec.clone(),
            };
            let opts = TargetOptions { no_cooperative: true, ..opts };
            let target = open_target_with(&spec, &opts)?;
            entries.push(Entry { label: format!("{label}+nocoop"), role, target });
        }
    }
    Ok(entries)
}

/// Each target in turn filled to `fill` of its capacity. A failure leaves none filled (the
/// filled ones are dropped, which removes their filler) and closes the rest as every other
/// error does.
fn fill_entries(mut entries: Vec<Entry>, fill: f64) -> Result<Vec<Entry>, String> {
    let mut filled = Vec::with_capacity(entries.len());
    for e in entries.drain(..) {
        if interrupted() {
            return Err("interrupted".into());
        }
        let target: Box<dyn Target> = Box::new(Filled::new(e.target, fill)?);
        filled.push(Entry { target, ..e });
    }
    Ok(filled)
}

/// How `--compare` makes one of its rows in the setup.
type MakeRow<'a> = dyn Fn(&mut Setup) -> Result<Box<dyn Target>, String> + 'a;

/// The references and lanefs rows of `--compare`, each made by `setup` (created on first use).
/// One that cannot be made is skipped with a note, in `notes` and on the terminal.
fn compare_entries(
    a: &BenchArgs,
    setup: &mut Option<Setup>,
    notes: &mut Vec<String>,
) -> Result<Vec<Entry>, String> {
    if a.images_in != Path::new("/dev/shm") {
        notes.push(format!("images of the references and lanefs rows in {}", a.images_in.display()));
    }
    let mut entries = Vec::new();
    let mut add =
        |label: &str, role: Role, unavailable: Option<String>, make: &MakeRow| -> Result<(), String> {
            if interrupted() {
                return Err("interrupted".into());
            }
            let made = match unavailable {
                Some(why) => Err(why),
                None => {
                    let s = match setup {
                        Some(s) => s,
                        None => setup.insert(Setup::new(&a.images_in)?),
                    };
                    make(s).map_err(|e| format!("{e} (skipped)"))
                }
            };
            match made {
                Ok(target) => entries.push(Entry { label: label.into(), role, target }),
                Err(why) => {
                    say(&format!("note: {why}"));
                    notes.push(why);
                }
            }
            Ok(())
        };
    for &r in &a.references {
        add(r.name(), Role::Reference, Setup::unavailable(r, &a.images_in), &|s| s.add(r))?;
    }
    // The lanefs rows: subjects, divided by every reference in the ratio table.
    for &k in &a.lanefs.0 {
        add(k.label(), Role::Subject, k.unavailable(&a.images_in), &|s| s.add_lanefs(k))?;
    }
    Ok(entries)
}

/// The tables of a `--compare` run: every target side by side, the ratios of subjects to
/// references, FUSE requests per operation, and the notes.
fn report_compare(entries: &[Entry], cells: &[Cell], m: &Matrix, machine: &Machine, notes: &[String]) {
    let labels: Vec<&str> = entries.iter().map(|e| e.label.as_str()).collect();
    let subjects: Vec<&str> =
        entries.iter().filter(|e| e.role == Role::Subject).map(|e| e.label.as_str()).collect();
    let references: Vec<&str> =
        entries.iter().filter(|e| e.role == Role::Reference).map(|e| e.label.as_str()).collect();
    emit(&format!(
        "Measured {} on {} cores, kernel {}, commit {}: {} s per run after {} s warm-up, {} round(s), \
         runs interleaved across targets.\n\n",
        machine.date, machine.cores, machine.kernel, machine.commit, m.cfg.seconds, m.cfg.warmup, m.rounds
    ));
    emit(&compare_table(cells, &labels, &m.workloads, &m.threads));
    let ratios = ratio_table(cells, &subjects, &references, &m.workloads, &m.threads);
    if ratios.is_empty() {
        emit("\n(no lanefs target in this run: no ratio table)\n");
    } else {
        emit(&format!("\nThroughput ratios (subject / reference):\n\n{ratios}"));
    }
    let requests = requests_table(cells, &m.workloads, &m.threads);
    if !requests.is_empty() {
        emit(&format!("\nFUSE requests per operation, timed phase:\n\n{requests}"));
    }
    let mut all = notes.to_vec();
    for c in cells {
        all.extend(c.notes.iter().map(|n| format!("{} {} {}T: {n}", c.target, c.workload, c.threads)));
    }
    if !all.is_empty() {
        emit("\n");
    }
    for n in &all {
        emit(&format!("note: {n}\n"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workload::Workload;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(args: &[&str]) -> Result<BenchArgs, String> {
        let mut v = vec!["lanefs-bench"];
        v.extend_from_slice(args);
        let a = Cli::try_parse_from(v).map_err(|e| e.to_string())?.bench;
        a.validate()?;
        Ok(a)
    }

    #[test]
    fn full_command_line() {
        let a = parse(&[
            "--target",
            "dir:/mnt/x",
            "--workload",
            "DWOL,mwcm,varmail",
            "--threads",
            "1,2,4",
            "--seconds",
            "1.5",
            "--json",
            "out.jsonl",
            "--plot",
            "p.png",
        ])
        .unwrap();
        assert_eq!(a.targets, vec![TargetSpec::Dir("/mnt/x".into())]);
        assert_eq!(a.workload.0, vec![Workload::Dwol, Workload::Mwcm, Workload::Varmail]);
        assert_eq!(a.threads, vec![1, 2, 4]);
        assert_eq!(a.seconds, 1.5);
        assert_eq!(a.json, Some(PathBuf::from("out.jsonl")));
        assert_eq!(a.plot, Some(PathBuf::from("p.png")));
        assert_eq!((a.fill, a.lib_cache), (0.0, None));
        let a2 = parse(&["--target", "lib:/x.img", "--fill", "0.97", "--lib-cache", "16M"]).unwrap();
        assert_eq!((a2.fill, a2.lib_cache), (0.97, Some(16 << 20)));
        let m = a.matrix();
        assert_eq!(m.rounds, 1);
        assert_eq!(m.cfg.warmup, RunConfig::default_warmup(1.5));
    }

    #[test]
    fn defaults_and_compare() {
        let a = parse(&["--compare"]).unwrap();
        assert!(a.compare && a.targets.is_empty());
        assert_eq!(a.workload.0.len(), 20);
        assert_eq!(a.threads, vec![1, 2]);
        assert_eq!(a.references, Reference::ALL.to_vec());
        assert_eq!(a.matrix().rounds, 3);
        let a = parse(&["--compare", "--references", "tmpfs,ext4", "--rounds", "2", "--target", "dir:/a"])
            .unwrap();
        assert_eq!(a.references, vec![Reference::Tmpfs, Reference::Ext4]);
        assert_eq!(a.matrix().rounds, 2);
        assert_eq!(a.targets.len(), 1);
    }

    #[test]
    fn rejections_are_one_line() {
        for bad in [
            &[][..],
            &["--target", "/no/kind"],
            &["--target", "dir:/x", "--workload", "DWZZ"],
            &["--target", "dir:/x", "--threads", "0"],
            &["--target", "dir:/x", "--threads", "a"],
            &["--target", "dir:/x", "--seconds", "0"],
            &["--target", "dir:/x", "--plot", "p.svg"],
            &["--compare", "--references", "zfs"],
            &["--compare", "--rounds", "0"],
            &["--target", "dir:/x", "--fill", "0.99"],
            &["--target", "dir:/x", "--fill", "x"],
            &["--target", "dir:/x", "--lib-cache", "512K"],
            &["--target", "dir:/x", "--lib-cache", "16Q"],
            &["--target", "dir:/x", "--nvm", "/dev/shm/r.nvm"],
            &["--target", "lib:/a", "--target", "lib:/b", "--nvm", "/dev/shm/r.nvm"],
        ] {
            let e = parse(bad).unwrap_err();
            assert!(!e.is_empty(), "{bad:?}");
            if !e.starts_with("error:") {
                // Our own validation errors: a single line.
                assert!(!e.contains('\n'), "{e}");
            }
        }
    }

    #[test]
    fn nvm_region_for_a_lib_target() {
        let a = parse(&["--target", "lib:/a.img", "--target", "dir:/x", "--nvm", "/dev/shm/r.nvm"]).unwrap();
        assert_eq!(a.nvm, Some(PathBuf::from("/dev/shm/r.nvm")));
        assert_eq!(a.nvm_inline, None);
        assert_eq!(a.cooperative, "on");
        assert!(parse(&["--target", "lib:/a.img", "--cooperative", "both"]).is_ok());
        assert!(parse(&["--target", "lib:/a.img", "--cooperative", "maybe"]).is_err());
        let a = parse(&["--target", "lib:/a.img", "--nvm", "/dev/shm/r.nvm", "--nvm-inline", "4"]).unwrap();
        assert_eq!(a.nvm_inline, Some(4));
        assert!(parse(&["--target", "lib:/a.img", "--nvm-inline", "4"]).is_err(), "--nvm-inline needs --nvm");
    }

    #[test]
    fn lanefs_compare_rows() {
        assert_eq!(parse(&["--compare"]).unwrap().lanefs.0, crate::compare::Lanefs::ALL.to_vec());
        assert!(parse(&["--compare", "--lanefs", "none"]).unwrap().lanefs.0.is_empty());
        assert!(parse(&["--compare", "--lanefs", "zfs"]).is_err());
    }

    #[test]
    fn mount_target_outside_lanefs_fails_cleanly() {
        if std::env::var_os(crate::target::mount::BIN_ENV).is_some() {
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let t = format!("mount:{}", d.path().join("x.img").display());
        let a = parse(&["--target", &t, "--workload", "DWOL", "--seconds", "0.1"]).unwrap();
        let e = run(&a).unwrap_err();
        assert!(e.starts_with(&t) && !e.contains('\n'), "{e}");
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0, "nothing left behind");
    }
}
