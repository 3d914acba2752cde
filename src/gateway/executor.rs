//! The SkillJob-backed executor: `skill_run` and the job tools as SkillJobs.
