//! Where a skill tree comes from when it is not a local directory: today a
//! git repository ([`git`]). A source only ever yields plain files in a
//! fresh directory; packaging then treats them like any local directory.

pub mod git;
