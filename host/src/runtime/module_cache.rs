//! The kernel modules of one build as an instance holds them: the softmax module loaded with
//! the instance, each operation module (by input type) on first use.

use kernels_gpu::launch::ops::DType;

use super::modules::{KernelBuild, LoadedModule, ModuleId};
use crate::error::{Error, Result};
use crate::plan::Entry;

#[derive(Debug)]
pub(crate) struct Modules {
    softmax: LoadedModule,
    operations: [Option<LoadedModule>; DType::ALL.len()],
    max_shared_per_block: u32,
    pub build: KernelBuild,
    compute_capability: (u32, u32),
}

impl Modules {
    /// Loads the softmax module of `build` for a device of `compute_capability` (the context
    /// must be current).
    pub fn open(
        build: KernelBuild,
        compute_capability: (u32, u32),
        max_shared_per_block: u32,
    ) -> Result<Self> {
        let softmax = Self::load_one(
            ModuleId::Softmax,
            build,
            compute_capability,
            max_shared_per_block,
        )?;
        Ok(Modules {
            softmax,
            operations: [const { None }; DType::ALL.len()],
            max_shared_per_block,
            build,
            compute_capability,
        })
    }

    pub fn get(&self, id: ModuleId) -> Option<&LoadedModule> {
        match id {
            ModuleId::Softmax => Some(&self.softmax),
            ModuleId::Operations(input) => self.operations[input as usize].as_ref(),
        }
    }

    /// The loaded module holding `entry`, or [`Error::ModuleNotLoaded`].
    pub fn loaded(&self, entry: Entry) -> Result<&LoadedModule> {
        self.get(entry.module())
            .ok_or_else(|| Error::ModuleNotLoaded {
                entry: entry.to_string(),
            })
    }

    /// Loads `id` of `build` as the image a device of `compute_capability` takes.
    fn load_one(
        id: ModuleId,
        build: KernelBuild,
        compute_capability: (u32, u32),
        max_shared_per_block: u32,
    ) -> Result<LoadedModule> {
        let image = id.image_for(build, compute_capability);
        LoadedModule::load(id, build, image, max_shared_per_block)
    }

    /// Loads `id` unless it is loaded (the context must be current).
    pub fn load(&mut self, id: ModuleId) -> Result<()> {
        if let ModuleId::Operations(input) = id
            && self.operations[input as usize].is_none()
        {
            let loaded = Self::load_one(
                id,
                self.build,
                self.compute_capability,
                self.max_shared_per_block,
            )?;
            self.operations[input as usize] = Some(loaded);
        }
        Ok(())
    }
}
