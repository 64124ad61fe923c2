//! Dead letters: a message ax cannot process is never dropped. It is kept in `<AX>_DEAD` on
//! `ax.internal.dead.<kind>` exactly as it came (payload and headers), with why it died added
//! as headers, so that an operator can read it, fix what produced it, and submit it again.

/// The kind of dead letter for a message that does not decode.
pub const UNDECODABLE: &str = "undecodable";

/// Header: why the message died.
pub const REASON: &str = "Ax-Dead-Reason";
/// Header: the subject it was published on.
pub const SUBJECT: &str = "Ax-Dead-Subject";
/// Header: the node that gave up on it.
pub const NODE: &str = "Ax-Dead-Node";
/// Header: when (RFC 3339).
pub const AT: &str = "Ax-Dead-At";
