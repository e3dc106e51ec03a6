//! An image whose NAT and lane journals live in a persistent-memory region: the region is
//! opened and checked with it.

use super::{Fsck, FsckOptions};
use crate::error::{Error, Result, Structure};
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::{Checkpoint, Superblock};
use crate::pmem::journal::NvmJournal;
use crate::pmem::nat::NvmNat;
use crate::pmem::{PmemRegion, RegionOptions};

impl Fsck<'_> {
    /// The region of an image whose pack keeps its NAT in one (`CP_FLAG_NVM_NAT`), opened and
    /// checked against the image (UUID, size); `None` for an image that keeps it on the device.
    pub(super) fn open_region(
        &mut self,
        sb: &Superblock,
        cp: &Checkpoint,
        opts: &FsckOptions,
    ) -> Result<Option<(NvmNat, NvmJournal)>> {
        let g = &sb.geometry;
        let flagged = cp.flags & CP_FLAG_NVM_NAT != 0;
        match (&opts.nvm, flagged) {
            (None, false) => Ok(None),
            (None, true) => Err(Error::InvalidArgument(format!(
                "checkpoint {} keeps the NAT and lane journals in a persistent-memory region: check it \
                 with --nvm FILE",
                cp.version
            ))),
            (Some(p), false) => {
                self.report.notes.push(format!(
                    "checkpoint {} keeps its NAT on the device: region {} is not in use (the next mount \
                     with it seeds it)",
                    cp.version,
                    p.display()
                ));
                Ok(None)
            }
            (Some(p), true) => {
                let region = PmemRegion::open(p, Some(sb.uuid), &RegionOptions::default())?;
                let nvm = NvmNat::new(region, g)?;
                let log = NvmJournal::new(nvm.region(), nvm.layout().end, g)?;
                self.report.notes.push(format!("region {}", nvm.describe()));
                Ok(Some((nvm, log)))
            }
        }
    }

    /// Decodes every transaction the region's lane journals hold under checkpoint `version`
    /// (each is replayed by the next mount); a journal that does not decode is a problem.
    /// Returns how many there are (`None`: they do not decode).
    pub(super) fn check_region_journals(
        &mut self,
        nvm: &NvmNat,
        log: &NvmJournal,
        version: u64,
    ) -> Option<usize> {
        match log.read(nvm.region(), version) {
            Ok(lanes) => {
                let txns: usize = lanes.iter().map(Vec::len).sum();
                let records: usize = lanes.iter().flatten().map(|t| t.records.len()).sum();
                if txns > 0 {
                    self.report.notes.push(format!(
                        "region lane journals: {txns} transactions ({records} records) since checkpoint \
                         {version}, replayed by the next mount"
                    ));
                }
                Some(txns)
            }
            Err(e) => {
                self.problem(Structure::Region, e.to_string(), false);
                None
            }
        }
    }
}
