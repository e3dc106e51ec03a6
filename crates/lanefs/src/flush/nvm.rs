//! Checkpoint hooks for the NAT in a persistent-memory region (`FsOptions::nvm`; protocol and
//! crash-safety argument in `crate::pmem`). Without a region both are no-ops and the NAT
//! blocks go to the device as before.

use crate::engine::Engine;
use crate::error::Result;
use crate::format::checkpoint::CP_FLAG_NVM_NAT;
use crate::format::{Checkpoint, NatBlock};

impl Engine {
    /// Before the pack of `cp` is written: with a region, the changed entries of the dirty NAT
    /// blocks `nat` are logged and committed there, the pack is flagged, and no NAT block is
    /// left for the device. Returns the NAT blocks the device must still get.
    pub(crate) fn stage_nat(&self, cp: &mut Checkpoint, nat: Vec<NatBlock>) -> Result<Vec<NatBlock>> {
        let Some(nvm) = &self.nvm else { return Ok(nat) };
        nvm.stage(cp.version, &nat)?;
        cp.flags |= CP_FLAG_NVM_NAT;
        Ok(Vec::new())
    }

    /// After the pack of checkpoint `version` is durable: its logged entries go in place.
    pub(crate) fn apply_nat(&self, version: u64) -> Result<()> {
        match &self.nvm {
            Some(nvm) => nvm.apply(version),
            None => Ok(()),
        }
    }
}
