//! The harness's errors are the control plane's ([`bootsman_controlplane::Error`]).

pub(crate) use bootsman_controlplane::error::{io, kube};
pub(crate) use bootsman_controlplane::{Error, Result};
