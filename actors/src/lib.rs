//! ax-actors: the five actors and the mechanisms they are built from.
#![warn(missing_docs)]
#![deny(unused_must_use)]

pub mod clock;
pub mod outbox;
pub mod fire_schedule;
pub mod planner;
pub mod process;
pub mod time_wheel;
