// Package dbcrash kills the database under idem: a private PostgreSQL or
// MariaDB server, started by the test in a temporary directory on a port
// of its own, is sent SIGKILL at random moments while concurrent clients
// run operations through idem.Engine (idempg, idemsql's MySQL dialect),
// each retrying its operation with the same key until it gets an answer.
// After a last crash and a clean restart, the tests read the database
// back and check that no acknowledged operation lost its effect or its
// stored answer, that no key ran twice, and that no key stays in flight.
//
// Every fault the other suites try kills idem or cuts its connections;
// here the server dies, and what it had not made durable is gone. That is
// what puts idempg's asynchronous claim to the test: the claim commits
// without waiting for its WAL to reach the disk, and relies on the
// business transaction's synchronous commit, which comes after it in the
// WAL, to flush it. The tests count the claims a crash erased, and check
// that none of them had been answered as done.
//
// On MariaDB without the binary log, InnoDB shows a committed transaction
// to other sessions before it writes the transaction's redo log. A
// duplicate that arrives in that instant is answered with the stored
// result, by a replay that a crash then undoes: the tests that show it
// are skipped unless IDEM_DBCRASH_KNOWN_LOSS=1. With the binary log on
// and synced at each commit (sync_binlog=1), a commit is shown only once
// it is recoverable, and those tests run by default.
//
// The package holds tests only. The runs and what was lost are in
// docs/RELIABILITY.md.
//
// # Environment
//
//	IDEM_DBCRASH_DURATION=2m    how long each store's workload runs under
//	                            kills (default 15s)
//	IDEM_DBCRASH_KNOWN_LOSS=1   also run the MariaDB tests without the
//	                            binary log, which show the loss above
//	IDEM_DBCRASH_MUTANT=name    weaken the servers' durability on purpose;
//	                            the tests must then report lost operations:
//	                            pg-async-commit (synchronous_commit=off),
//	                            mariadb-flush-0 or mariadb-flush-2
//	                            (innodb_flush_log_at_trx_commit)
//
// The servers' binaries are found under /usr/lib/postgresql/*/bin (or on
// PATH) and as mariadb-install-db and mariadbd (/usr/sbin); strace holds
// MariaDB's writes back in TestMariaDBReplayOfUnwrittenCompletion. When
// one is missing the tests skip, or fail under CI=true. Run as root,
// PostgreSQL runs as the postgres user (or nobody) and mariadbd with
// --user=root.
package dbcrash
