//! Getting back to what was acknowledged: catching up with the log at open, replaying its
//! frames, restoring in place after a failure, and the poison that stops writes meanwhile.

pub(super) mod catch_up;
pub(super) mod poison;
pub(super) mod replay;
pub(super) mod restore;
