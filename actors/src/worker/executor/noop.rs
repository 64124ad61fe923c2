//! The `noop` executor: succeeds at once without starting anything — a join point in a graph,
//! or a probe of the scheduler itself (the benchmark's end-to-end instances).

use futures::future::BoxFuture;

use ax_bus::messages::ExecutorInfo;
use ax_bus::spec::Builtin;

use super::{builtin, AttemptContext, ExecResult, Executor};

/// See the module.
pub(crate) struct Noop;

impl Executor for Noop {
    fn describe(&self) -> ExecutorInfo {
        builtin(Builtin::Noop, "succeeds at once without running anything")
    }

    fn run<'a>(&'a self, _ctx: &'a AttemptContext<'a>) -> BoxFuture<'a, ExecResult> {
        Box::pin(async { ExecResult::completed("noop", serde_json::Value::Null) })
    }
}
