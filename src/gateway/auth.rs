//! Bearer tokens verified by TokenReview, actions authorized by SubjectAccessReview.
