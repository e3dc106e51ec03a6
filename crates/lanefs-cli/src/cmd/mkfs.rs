//! `lanefs mkfs`: format an image file or a block device.

use super::{default_lanes, open};
use crate::size;
use lanefs::device::{self, IoChoice};
use std::path::Path;

pub fn mkfs(
    image: &Path,
    size: Option<u64>,
    lanes: Option<u32>,
    label: &str,
    force: bool,
) -> Result<(), String> {
    let lanes = lanes.unwrap_or_else(default_lanes);
    let max = lanefs::format::superblock::LABEL_MAX;
    if label.len() > max {
        return Err(format!("label of {} bytes: a label holds at most {max}", label.len()));
    }
    let meta = std::fs::metadata(image);
    let is_file = match &meta {
        Ok(m) => m.file_type().is_file(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => true,
        Err(e) => return Err(format!("{}: {e}", image.display())),
    };
    if let Some(s) = size {
        let min = lanefs::format::Geometry::min_size_bytes(lanes);
        if s < min {
            return Err(format!(
                "size {} is below the minimum of {} for {lanes} lanes",
                size::show(s),
                size::show(min)
            ));
        }
    }
    if meta.is_err() {
        let s =
            size.ok_or_else(|| format!("{} does not exist: give --size to create it", image.display()))?;
        device::create_image(image, s).map_err(|e| format!("{}: {e}", image.display()))?;
    } else {
        let dev = open(image, IoChoice::Auto)?;
        if let Some(what) = lanefs::detect_existing(&dev).map_err(|e| e.to_string())? {
            if !force {
                return Err(format!("{} holds {what}; use --force to format it anyway", image.display()));
            }
        }
        if let Some(s) = size {
            if !is_file {
                return Err("--size applies to image files; a block device is formatted whole".into());
            }
            std::fs::OpenOptions::new()
                .write(true)
                .open(image)
                .and_then(|f| f.set_len(s))
                .map_err(|e| format!("{}: {e}", image.display()))?;
        }
    }
    let dev = open(image, IoChoice::Auto)?;
    let opts = lanefs::MkfsOptions { lanes, label: label.to_string(), ..Default::default() };
    let sb = lanefs::format_device(&dev, &opts).map_err(|e| e.to_string())?;
    let g = sb.geometry;
    println!(
        "lanefs: formatted {} ({}, {} lanes, {} segments of 2 MiB, uuid {})",
        image.display(),
        size::show(g.total_blocks * 4096),
        g.lanes,
        g.main_segments,
        sb.uuid_str()
    );
    Ok(())
}
