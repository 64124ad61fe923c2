//! The integration tests, as one crate: one binary to build and link instead of one per file,
//! run by cargo-nextest one test per process and several at a time (`.config/nextest.toml`
//! says which tests run alone). Each module is one topic; `support` holds what they share:
//! test nats-servers and clusters, `ax` processes that die with the test, waiting on
//! conditions with deadlines.

mod alerts;
mod apply_fire_result;
mod async_report;
mod attempt_logs;
mod auth;
mod ax_up;
mod backup;
mod bad_input;
mod bench_smoke;
mod budget;
mod bursts;
mod chaos;
mod clock_skew;
mod console;
mod console_auth;
mod controlled_clock;
mod dead_letters;
mod dependencies;
mod executors;
mod failure_paths;
mod feeds;
mod figures;
mod fleet;
mod hostile_input;
mod instance_buckets;
mod instance_updates;
mod leases;
mod lineage;
mod local_run;
mod metrics;
mod namespaces;
mod nats_auth;
mod nats_cluster;
mod openapi;
mod openlineage;
mod operator;
mod orphans;
mod partitions;
mod policies;
mod protocol;
mod provisioning;
mod python_client;
mod rerun_backfill;
mod resources;
mod retention;
mod scale_out;
mod shards;
mod shell_executor;
mod sql_executor;
mod storage_full;
mod stranded;
mod support;
mod systemd_units;
mod triggers;
mod wire_corpus;
mod worker_death;
