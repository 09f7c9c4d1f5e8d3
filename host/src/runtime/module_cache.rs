//! The kernel modules of one build as an instance holds them, one place per module of the
//! generated table: the softmax module loaded with the instance, each operation module (by
//! input type) on first use.

use super::modules::{KernelBuild, LoadedModule, MODULE_COUNT, ModuleId};
use crate::error::{Error, Result};
use crate::plan::Entry;

#[derive(Debug)]
pub(crate) struct Modules {
    loaded: [Option<LoadedModule>; MODULE_COUNT],
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
        let mut modules = Modules {
            loaded: [const { None }; MODULE_COUNT],
            max_shared_per_block,
            build,
            compute_capability,
        };
        modules.load(ModuleId::Softmax)?;
        Ok(modules)
    }

    pub fn get(&self, id: ModuleId) -> Option<&LoadedModule> {
        self.loaded[id.index()].as_ref()
    }

    /// The loaded module holding `entry`, or [`Error::ModuleNotLoaded`].
    pub fn loaded(&self, entry: Entry) -> Result<&LoadedModule> {
        self.get(entry.module())
            .ok_or_else(|| Error::ModuleNotLoaded {
                entry: entry.to_string(),
            })
    }

    /// Loads `id` of this build, as the image the device takes, unless it is loaded (the
    /// context must be current).
    pub fn load(&mut self, id: ModuleId) -> Result<()> {
        if self.loaded[id.index()].is_none() {
            let image = id.image_for(self.build, self.compute_capability);
            let module = LoadedModule::load(id, self.build, image, self.max_shared_per_block)?;
            self.loaded[id.index()] = Some(module);
        }
        Ok(())
    }
}
