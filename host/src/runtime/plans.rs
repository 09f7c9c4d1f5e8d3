//! The plan cache: each request, shape and layout planned once (planning queries the driver
//! for occupancy, which costs more host time than a short kernel runs), with the entries'
//! handles resolved and the workspace the launches need.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

use cust::sys;

use super::driver::DeviceInfo;
use super::module_cache::Modules;
use super::modules::LoadedModule;
use crate::error::{Error, Result};
use crate::plan::{self, DeviceLimits, Entry, Launch, Layout, Request, WorkspaceNeeds};
use crate::shape::Shape;

/// Plans kept before the cache starts over (reserved plans aside, which are always kept): a
/// process that sees ever new shapes keeps a bounded amount of memory, and one that reuses a
/// few shapes never replans them.
const PLAN_CACHE_LIMIT: usize = 4096;

/// What a plan is kept under.
pub(crate) type PlanKey = (Request, Shape, Layout);

/// A plan made once: its launches, each entry's handle, and what they need of the workspace.
#[derive(Debug)]
pub(crate) struct Prepared {
    pub launches: Vec<Launch>,
    pub functions: Vec<sys::CUfunction>,
    pub needs: WorkspaceNeeds,
}

/// The plans made so far, and which of them `reserve` asked to keep.
#[derive(Debug, Default)]
pub(crate) struct PlanCache {
    plans: HashMap<PlanKey, Rc<Prepared>, BuildHasherDefault<KeyHasher>>,
    reserved: HashSet<PlanKey>,
}

impl PlanCache {
    pub fn get(&self, key: &PlanKey) -> Option<Rc<Prepared>> {
        self.plans.get(key).cloned()
    }

    /// Plans `key` on the device `limits` describe (its modules loaded), resolving each
    /// launch's entry; a plan for which an occupancy query failed is an error and is not
    /// kept.
    pub fn make(
        &mut self,
        key: PlanKey,
        info: &DeviceInfo,
        modules: &Modules,
    ) -> Result<Rc<Prepared>> {
        let (request, shape, layout) = key;
        let limits = Limits {
            info,
            modules,
            failure: RefCell::new(None),
        };
        let launches = plan::plan(request, shape, layout, &limits)?;
        if let Some(error) = limits.failure.into_inner() {
            return Err(error);
        }
        for launch in &launches {
            if launch.grid == 0 || launch.grid > plan::MAX_GRID {
                return Err(Error::ShapeTooLarge {
                    rows: shape.rows(),
                    cols: shape.cols(),
                    why: "the launch would need more blocks than a grid holds",
                });
            }
        }
        let functions = launches
            .iter()
            .map(|l| modules.loaded(l.entry)?.function(l.entry))
            .collect::<Result<Vec<_>>>()?;
        let prepared = Rc::new(Prepared {
            needs: plan::workspace_needs(&launches),
            launches,
            functions,
        });
        if self.plans.len() >= PLAN_CACHE_LIMIT + self.reserved.len() {
            let reserved = &self.reserved;
            self.plans.retain(|key, _| reserved.contains(key));
        }
        self.plans.insert(key, Rc::clone(&prepared));
        Ok(prepared)
    }

    /// Keeps the plan of `key` whatever the cache holds otherwise.
    pub fn keep(&mut self, key: PlanKey) {
        self.reserved.insert(key);
    }
}

/// The plan cache's hasher. Every call looks its plan up, and a key is a handful of small
/// integers from the library itself, so SipHash's resistance to chosen keys buys nothing:
/// each word is folded in with a rotate, an xor and a multiply by an odd constant.
#[derive(Default)]
struct KeyHasher(u64);

impl KeyHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

impl Hasher for KeyHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.add(u64::from_le_bytes(word));
        }
    }

    fn write_u8(&mut self, value: u8) {
        self.add(value.into());
    }

    fn write_u32(&mut self, value: u32) {
        self.add(value.into());
    }

    fn write_u64(&mut self, value: u64) {
        self.add(value);
    }

    fn write_usize(&mut self, value: usize) {
        self.add(value as u64);
    }
}

/// The device's limits as the planner sees them, from occupancy queries on the loaded
/// modules. A failed query is remembered (and answered 0, which rules the configuration out),
/// so that the plan is refused rather than degraded.
struct Limits<'a> {
    info: &'a DeviceInfo,
    modules: &'a Modules,
    failure: RefCell<Option<Error>>,
}

impl Limits<'_> {
    fn answer(&self, result: Result<u32>) -> u32 {
        result.unwrap_or_else(|error| {
            self.failure.borrow_mut().get_or_insert(error);
            0
        })
    }

    fn module(&self, entry: Entry) -> Result<&LoadedModule> {
        self.modules.loaded(entry)
    }
}

impl DeviceLimits for Limits<'_> {
    fn multiprocessors(&self) -> u32 {
        self.info.multiprocessors
    }

    fn max_shared_per_block(&self) -> u32 {
        self.info.max_shared_per_block
    }

    fn blocks_per_sm(&self, entry: Entry, threads: u32, shared_bytes: u32) -> u32 {
        let result = self
            .module(entry)
            .and_then(|m| m.blocks_per_sm(entry, threads, shared_bytes));
        self.answer(result)
    }

    fn cooperative_launch(&self) -> bool {
        self.info.supports_cooperative_launch
    }

    fn thread_block_clusters(&self) -> bool {
        self.modules.build.hopper_features()
    }

    fn memory_bytes_per_us(&self) -> u64 {
        // Two transfers a clock (double data rate), the bus's width in bytes each.
        2 * u64::from(self.info.memory_clock_mhz) * u64::from(self.info.memory_bus_bits / 8)
    }

    fn active_clusters(&self, entry: Entry, threads: u32, shared_bytes: u32, cluster: u32) -> u32 {
        let result = self
            .module(entry)
            .and_then(|m| m.active_clusters(entry, threads, shared_bytes, cluster));
        self.answer(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::variant::Variant;

    #[test]
    fn the_plan_cache_hasher_tells_keys_apart() {
        use std::hash::{BuildHasher, BuildHasherDefault};
        let hasher = BuildHasherDefault::<KeyHasher>::default();
        let shapes = [
            (1, 32000),
            (32000, 1),
            (2, 16000),
            (4096, 1000),
            (1000, 4096),
        ];
        let hashes: HashSet<u64> = shapes
            .iter()
            .flat_map(|&(rows, cols)| {
                let shape = Shape::new(rows, cols).unwrap();
                [Layout::Aligned, Layout::Peeled, Layout::Elements]
                    .map(|layout| hasher.hash_one((Request::Variant(Variant::Auto), shape, layout)))
            })
            .collect();
        assert_eq!(hashes.len(), shapes.len() * 3);
    }
}
