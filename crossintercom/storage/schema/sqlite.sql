-- The shared store's schema on SQLite, whole (docs/storage.md, "Schema"): the same tables as
-- postgres.sql. SQLite has no roles: the file's permissions are the trust boundary
-- (docs/operations.md), and what another writer may have put in a row is checked when it is
-- read (storage/rowcheck.py). Run by the baseline revision (migrations/versions/0016_baseline.py).

-- hosts: version, last_error_code, last_error, last_error_at come with revision 0017, at the
-- end (SQLite keeps a CREATE TABLE's text, comments too: the baseline's stays the old head's).
CREATE TABLE hosts (
    host_id VARCHAR(255) NOT NULL,
    generation BIGINT NOT NULL,
    heartbeat BIGINT NOT NULL,
    machine VARCHAR(255),
    roster_rev BIGINT DEFAULT '0' NOT NULL,
    beat_at DATETIME,
    CONSTRAINT pk_hosts PRIMARY KEY (host_id)
);

CREATE TABLE messages (
    message_id VARCHAR(128) NOT NULL,
    sender_host VARCHAR(255) NOT NULL,
    digest VARCHAR(64) NOT NULL,
    payload JSON NOT NULL,
    size INTEGER NOT NULL,
    created DATETIME NOT NULL,
    CONSTRAINT pk_messages PRIMARY KEY (message_id)
);
CREATE INDEX ix_messages_sender_host ON messages (sender_host);

CREATE TABLE receipts (
    id INTEGER NOT NULL,
    sender_host VARCHAR(255) NOT NULL,
    message_id VARCHAR(128) NOT NULL,
    recipient_session VARCHAR(64) NOT NULL,
    recipient_host VARCHAR(255) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    code VARCHAR(64),
    created DATETIME NOT NULL,
    sender_session VARCHAR(64),
    note VARCHAR(1000),
    CONSTRAINT pk_receipts PRIMARY KEY (id)
);
CREATE INDEX ix_receipts_created ON receipts (created);
CREATE INDEX ix_receipts_sender ON receipts (sender_host, id);

CREATE TABLE settings (
    id INTEGER NOT NULL,
    max_message_bytes INTEGER NOT NULL,
    retention_s INTEGER NOT NULL,
    CONSTRAINT pk_settings PRIMARY KEY (id),
    CONSTRAINT ck_settings_single_row CHECK (id = 1)
);
INSERT INTO settings (id, max_message_bytes, retention_s) VALUES (1, 1048576, 604800);

CREATE TABLE deliveries (
    seq INTEGER NOT NULL,
    message_id VARCHAR(128) NOT NULL,
    recipient_host VARCHAR(255) NOT NULL,
    recipient_session VARCHAR(64) NOT NULL,
    state VARCHAR(16) NOT NULL,
    reason VARCHAR(64),
    expires_at DATETIME NOT NULL,
    finished_at DATETIME,
    CONSTRAINT pk_deliveries PRIMARY KEY (seq),
    CONSTRAINT ck_deliveries_state_valid CHECK (state IN ('queued', 'delivered', 'refused', 'expired')),
    CONSTRAINT fk_deliveries_message_id_messages FOREIGN KEY(message_id) REFERENCES messages (message_id),
    CONSTRAINT uq_deliveries_message_id_recipient_session UNIQUE (message_id, recipient_session)
);
CREATE INDEX ix_deliveries_expiry ON deliveries (expires_at) WHERE state = 'queued';
CREATE INDEX ix_deliveries_inbound ON deliveries (recipient_host, seq) WHERE state = 'queued';
CREATE INDEX ix_deliveries_purge ON deliveries (finished_at) WHERE state <> 'queued';

CREATE TABLE roster (
    host_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(64) NOT NULL,
    name VARCHAR(64),
    cwd TEXT,
    model TEXT,
    status TEXT,
    purpose VARCHAR(16) NOT NULL,
    groups JSON NOT NULL,
    durable BOOLEAN NOT NULL,
    online BOOLEAN NOT NULL,
    wake VARCHAR(16),
    CONSTRAINT pk_roster PRIMARY KEY (host_id, session_id),
    CONSTRAINT fk_roster_host_id_hosts FOREIGN KEY(host_id) REFERENCES hosts (host_id)
);
CREATE UNIQUE INDEX uq_roster_session_id ON roster (session_id);

CREATE TABLE host_roles (
    role_name VARCHAR(63) NOT NULL,
    host_id VARCHAR(255) NOT NULL,
    CONSTRAINT pk_host_roles PRIMARY KEY (role_name),
    CONSTRAINT uq_host_roles_host_id UNIQUE (host_id)
);

CREATE TABLE archive_settings (
    id INTEGER NOT NULL,
    enabled BOOLEAN NOT NULL,
    retention_s INTEGER NOT NULL,
    CONSTRAINT pk_archive_settings PRIMARY KEY (id),
    CONSTRAINT ck_archive_settings_single_row CHECK (id = 1)
);

CREATE TABLE archive_messages (
    seq INTEGER NOT NULL,
    message_id VARCHAR(128) NOT NULL,
    thread_id VARCHAR(128) NOT NULL,
    subject TEXT,
    sender_id VARCHAR(64) NOT NULL,
    sender_name VARCHAR(64),
    sender_host VARCHAR(255) NOT NULL,
    target TEXT NOT NULL,
    body TEXT NOT NULL,
    reply_to VARCHAR(128),
    expects_reply BOOLEAN NOT NULL,
    sent_at DATETIME NOT NULL,
    archived_at DATETIME NOT NULL,
    payload JSON NOT NULL,
    CONSTRAINT pk_archive_messages PRIMARY KEY (seq),
    CONSTRAINT uq_archive_messages_message_id UNIQUE (message_id)
);
CREATE INDEX ix_archive_messages_thread_id ON archive_messages (thread_id, seq);
CREATE INDEX ix_archive_messages_sender_host ON archive_messages (sender_host);
CREATE INDEX ix_archive_messages_archived_at ON archive_messages (archived_at);

CREATE TABLE archive_recipients (
    message_id VARCHAR(128) NOT NULL,
    session_id VARCHAR(64) NOT NULL,
    host_id VARCHAR(255) NOT NULL,
    name VARCHAR(64),
    outcome VARCHAR(16) NOT NULL,
    code VARCHAR(64),
    CONSTRAINT pk_archive_recipients PRIMARY KEY (message_id, session_id)
);
CREATE INDEX ix_archive_recipients_host_id ON archive_recipients (host_id);

-- The archive's full-text index (outside the metadata: tables.include_name): an FTS5 table
-- over archive_messages (external content, so the text is stored once) kept in step by
-- triggers. The archive is insert-only: no UPDATE trigger.
CREATE VIRTUAL TABLE archive_fts USING fts5(subject, body, content='archive_messages', content_rowid='seq', tokenize='porter unicode61 remove_diacritics 2');
CREATE TRIGGER archive_fts_insert AFTER INSERT ON archive_messages BEGIN INSERT INTO archive_fts (rowid, subject, body) VALUES (new.seq, new.subject, new.body); END;
CREATE TRIGGER archive_fts_delete AFTER DELETE ON archive_messages BEGIN INSERT INTO archive_fts (archive_fts, rowid, subject, body) VALUES ('delete', old.seq, old.subject, old.body); END;

-- hosts.beat_at, by the database's clock. SQLite cannot assign NEW: the row is stamped after
-- the write (recursive triggers are off).
CREATE TRIGGER hosts_beat_at_insert AFTER INSERT ON hosts BEGIN UPDATE hosts SET beat_at = CURRENT_TIMESTAMP WHERE host_id = NEW.host_id; END;
CREATE TRIGGER hosts_beat_at AFTER UPDATE OF heartbeat, generation ON hosts BEGIN UPDATE hosts SET beat_at = CURRENT_TIMESTAMP WHERE host_id = NEW.host_id; END;

CREATE TABLE "reservations" (
    id VARCHAR(64) NOT NULL,
    project VARCHAR(255) NOT NULL,
    "glob" TEXT NOT NULL,
    mode VARCHAR(16) NOT NULL,
    host_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(64) NOT NULL,
    generation BIGINT NOT NULL,
    reason TEXT,
    created DATETIME NOT NULL,
    expires_at DATETIME NOT NULL,
    CONSTRAINT pk_reservations PRIMARY KEY (id),
    CONSTRAINT ck_reservations_mode_valid CHECK (mode IN ('exclusive', 'shared')),
    CONSTRAINT uq_reservations_project_host_id_session_id_glob UNIQUE (project, host_id, session_id, "glob")
);
CREATE INDEX ix_reservations_host_id ON reservations (host_id, session_id);

-- --- revision 0017: each host's crossintercom version and its relay's last error -------------

ALTER TABLE hosts ADD COLUMN version VARCHAR(64);
ALTER TABLE hosts ADD COLUMN last_error_code VARCHAR(64);
ALTER TABLE hosts ADD COLUMN last_error VARCHAR(200);
ALTER TABLE hosts ADD COLUMN last_error_at DATETIME;
