//! Warm starts for `run` and `serve`: read the model's saved hot set back into the expert
//! cache in the background at start, and save this run's hot set at exit (and, for `serve`,
//! every few minutes). See [`sluice_store::hotset`] for the file and
//! [`sluice_store::StreamingExperts::warm`] for how the reads yield to the first token's.
//!
//! A hot-set file that is corrupt, from another model or names experts the model lacks is
//! ignored with a warning; `--no-warm-start` neither reads nor writes one. Only a streaming
//! store reading a full checkpoint has a cache to warm (a mapped store leaves residency to the
//! page cache; a stream install's experts may not be on local disk yet).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use sluice_store::hotset::{self, HotSet, HotSetError};
use sluice_store::StreamingExperts;

/// A warm start in progress: where the hot set goes at exit and what it held before.
#[derive(Debug)]
pub struct WarmStart {
    store: Arc<StreamingExperts>,
    path: PathBuf,
    fingerprint: String,
    previous: HotSet,
}

/// Reads the hot set of the model in `dir` into `store`'s cache in the background (when
/// `enabled` and the model streams), and returns the handle that saves it again.
pub fn begin(
    dir: &Path,
    store: Option<&Arc<StreamingExperts>>,
    enabled: bool,
) -> Option<WarmStart> {
    // A stream install's experts may not be on local disk yet: warming would fetch them.
    let store = store.filter(|s| enabled && s.disk_cache().is_none())?;
    let fingerprint = hotset::fingerprint(dir, store.index());
    let path = hotset::path_for(dir, &sluice_engine::demo::cache_dir(), &fingerprint);
    let previous = match HotSet::load(&path, &fingerprint, store.index()) {
        Ok(set) => {
            let order = set.order();
            let started = store.warm(&order);
            eprintln!(
                "sluice: warm start: reading {started} of the {} experts in the saved hot set \
                 ({}) in the background, most used first; the first token's reads go ahead of \
                 them",
                order.len(),
                path.display()
            );
            set
        }
        Err(HotSetError::Missing) => HotSet::default(),
        Err(e) => {
            eprintln!("sluice: warning: warm start: {e}");
            HotSet::default()
        }
    };
    Some(WarmStart { store: Arc::clone(store), path, fingerprint, previous })
}

impl WarmStart {
    /// Saves the hot set: the saved one's counts halved (older use counts for less) plus
    /// this run's. A failure is a warning: the next start is only colder.
    pub fn save(&self) {
        let mut set = self.previous.clone();
        set.decay();
        set.merge(&self.store.hot_set());
        if let Err(e) = set.save(&self.path, &self.fingerprint) {
            eprintln!("sluice: warning: could not save the hot set for the next start: {e}");
        }
    }
}
