//! The sql executor against SQLite and the machine's PostgreSQL and MariaDB servers (each test
//! run makes its own databases and drops them): params are bound, never spliced — a value
//! holding a quote or `'; DROP TABLE x; --` stays data; the first row becomes the output; a
//! failing statement fails the attempt with the database's reason; the connection string
//! (with its password) appears in no record and no log.

use crate::support;

use std::time::Duration;

use sqlx::any::AnyPoolOptions;
use sqlx::AnyPool;

use ax_bus::{State, Tag};
use support::*;

const POSTGRES_ADMIN: &str = "postgres://postgres@127.0.0.1:5432/postgres";
const MARIADB_ADMIN: &str = "mysql://root@127.0.0.1:3306/mysql";
const EVIL: &str = "O'Brien'); DROP TABLE items; --";
const PASSWORD: &str = "s3cret-never-shown";

async fn pool(url: &str) -> AnyPool {
    sqlx::any::install_default_drivers();
    AnyPoolOptions::new()
        .max_connections(1)
        .connect(url)
        .await
        .unwrap_or_else(|e| panic!("cannot reach the test database ({e}); is it running?"))
}

async fn exec(pool: &AnyPool, sql: String) {
    sqlx::query(sqlx::AssertSqlSafe(sql.clone()))
        .execute(pool)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// A database of this test run on one server; dropped at the end of the test.
struct TestDatabase {
    admin: &'static str,
    name: String,
    /// The URL the worker gets.
    url: String,
}

impl TestDatabase {
    async fn create(admin: &'static str, url_of: impl Fn(&str) -> String) -> Self {
        let name = format!(
            "ax_test_{}_{}",
            std::process::id(),
            ax_bus::time::now().timestamp_micros()
        );
        exec(&pool(admin).await, format!("CREATE DATABASE {name}")).await;
        let url = url_of(&name);
        Self { admin, name, url }
    }

    async fn drop_it(self) {
        let pool = pool(self.admin).await;
        let force = if self.admin.starts_with("postgres") {
            " WITH (FORCE)"
        } else {
            ""
        };
        exec(
            &pool,
            format!("DROP DATABASE IF EXISTS {}{force}", self.name),
        )
        .await;
    }
}

fn sql_job(name: &str, database: &str, statement: &str, output: &str) -> String {
    format!(
        "version: v1\njob:\n  name: {name}\n  params: {{ name: \"{}\", n: 7 }}\n  exec:\n    type: sql\n    database: {database}\n    statement: \"{statement}\"\n{output}",
        EVIL.replace('"', "\\\"")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_bind_params_on_sqlite_postgres_and_mariadb() {
    let nats = TestNats::start();
    let client = nats.client().await;
    let sqlite_file = nats.path("db").join("local.db");
    let sqlite = format!("sqlite://{}?mode=rwc", sqlite_file.display());
    let postgres = TestDatabase::create(POSTGRES_ADMIN, |db| {
        // Trust auth ignores the password; it is there to prove it is never shown.
        format!("postgres://postgres:{PASSWORD}@127.0.0.1:5432/{db}")
    })
    .await;
    let mariadb = TestDatabase::create(MARIADB_ADMIN, |db| {
        format!("mysql://root@127.0.0.1:3306/{db}")
    })
    .await;
    let config = format!(
        "[databases]\nlite = \"{sqlite}\"\npg = \"{}\"\nmaria = \"{}\"\n",
        postgres.url, mariadb.url
    );
    let node = AxProcess::configured(&nats, "n1", "all", &config);

    for (database, url) in [
        ("lite", sqlite.as_str()),
        ("pg", postgres.url.as_str()),
        ("maria", mariadb.url.as_str()),
    ] {
        let direct = pool(url).await;
        exec(
            &direct,
            "CREATE TABLE items (name VARCHAR(200), n INTEGER)".to_string(),
        )
        .await;
        let run = |name: String, yaml: String| {
            let nats = &nats;
            let client = &client;
            async move {
                apply_job(nats, &name, &yaml).await;
                let id = trigger(nats, &[&name]);
                final_record(client, &id, Duration::from_secs(30)).await
            }
        };

        let inserted = run(
            format!("ins-{database}"),
            sql_job(
                &format!("ins-{database}"),
                database,
                "INSERT INTO items (name, n) VALUES ({{params.name}}, {{params.n}})",
                "",
            ),
        )
        .await;
        assert_eq!(
            inserted.state,
            State::Success,
            "{database}: {}",
            inserted.message
        );
        assert_eq!(inserted.output["rows_affected"], 1, "{database}");

        let selected = run(
            format!("sel-{database}"),
            sql_job(
                &format!("sel-{database}"),
                database,
                "SELECT name, n, (SELECT COUNT(*) FROM items) AS total FROM items WHERE n = {{params.n}} AND name = {{params.name}}",
                "    output: first_row\n",
            ),
        )
        .await;
        assert_eq!(
            selected.state,
            State::Success,
            "{database}: {}",
            selected.message
        );
        assert_eq!(selected.output["name"], EVIL, "{database}");
        assert_eq!(selected.output["n"], 7, "{database}");
        assert_eq!(
            selected.output["total"], 1,
            "{database}: {}",
            selected.output
        );

        let broken = run(
            format!("bad-{database}"),
            sql_job(
                &format!("bad-{database}"),
                database,
                "SELECT missing_col FROM no_such_table WHERE n = {{params.n}}",
                "",
            ),
        )
        .await;
        assert_eq!(
            (broken.state, broken.tag),
            (State::Failed, Tag::Rejected),
            "{database}"
        );
        assert!(
            broken.message.contains(&format!("database {database}"))
                && broken.message.contains("no_such_table"),
            "{database}: {}",
            broken.message
        );

        // The table is intact and holds exactly the one row: the value stayed data.
        let (count,): (i64,) = sqlx::query_as("SELECT COUNT(*) FROM items")
            .fetch_one(&direct)
            .await
            .unwrap();
        assert_eq!(count, 1, "{database}");
        for record in [&inserted, &selected, &broken] {
            let text = format!(
                "{} {} {}",
                record.message, record.stdout_tail, record.stderr_tail
            );
            assert!(
                !text.contains(PASSWORD) && !text.contains("127.0.0.1"),
                "{text}"
            );
        }
    }

    let unknown = sql_job("nowhere", "warehouse", "SELECT 1", "");
    apply_job(&nats, "nowhere", &unknown).await;
    let id = trigger(&nats, &["nowhere"]);
    let record = final_record(&client, &id, Duration::from_secs(30)).await;
    assert_eq!(
        (record.state, record.tag),
        (State::Failed, Tag::ExecutorError)
    );
    assert!(
        record.message.contains("no database `warehouse`")
            && record.message.contains("lite, maria, pg"),
        "{}",
        record.message
    );
    assert!(
        !node.log_text().contains(PASSWORD),
        "the password reached the log"
    );
    drop(node);
    postgres.drop_it().await;
    mariadb.drop_it().await;
}
