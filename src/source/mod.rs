//! Where a skill tree comes from when it is not a local directory: a git
//! repository ([`git`]) or a ZIP, turned into one package per skill
//! ([`snapshot`]). A source only ever yields plain files in a fresh
//! directory; packaging then treats them like any local directory.

pub mod follow;
pub mod git;
pub mod snapshot;
pub mod ssh;
