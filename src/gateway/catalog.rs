//! Packages pulled by digest into a bounded on-disk cache; a namespace's snapshot from its bindings.
