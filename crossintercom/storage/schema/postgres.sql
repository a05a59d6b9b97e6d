-- The shared store's schema on PostgreSQL, whole: tables, the per-host roles' rights and
-- row-security policies, and the owner-rights functions they call (docs/storage.md, "Schema";
-- the trust model in docs/operations.md, "Per-host roles"). Run by the baseline revision
-- (migrations/versions/0016_baseline.py) in one transaction.
--
-- @CODES@ and @RECEIPT_OUTCOMES@ stand for the lists a row may carry, written in from
-- crossintercom.codes and crossintercom.models when the file is run; `db upgrade` writes them
-- again whenever the lists grew (storage/schema/__init__.py, refresh), so a new code or outcome
-- needs no revision. Every policy asks for the role's host as a scalar subquery,
-- (SELECT public.crossintercom_host()), which the server runs once per statement rather than
-- once per row (tests/storage/test_installed_policies.py holds every policy to it).

-- --- tables --------------------------------------------------------------------------------

CREATE TABLE hosts (
    host_id VARCHAR(255) NOT NULL,
    generation BIGINT NOT NULL,
    heartbeat BIGINT NOT NULL,
    -- The machine identity of the relay holding the current generation (NULL: none named).
    machine VARCHAR(255),
    -- Bumped by every roster change of the host: other relays re-read rosters when it moves.
    roster_rev BIGINT DEFAULT '0' NOT NULL,
    -- When the heartbeat last moved, by the database's clock (set by hosts_beat_at only).
    beat_at TIMESTAMP WITH TIME ZONE,
    -- version, last_error_code, last_error, last_error_at: revision 0017, at the end.
    CONSTRAINT pk_hosts PRIMARY KEY (host_id)
);

CREATE TABLE messages (
    message_id VARCHAR(128) NOT NULL,
    sender_host VARCHAR(255) NOT NULL,
    digest VARCHAR(64) NOT NULL,
    payload JSON NOT NULL,
    size INTEGER NOT NULL,
    created TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT pk_messages PRIMARY KEY (message_id)
);
CREATE INDEX ix_messages_sender_host ON messages (sender_host);

CREATE TABLE receipts (
    id BIGSERIAL NOT NULL,
    sender_host VARCHAR(255) NOT NULL,
    message_id VARCHAR(128) NOT NULL,
    recipient_session VARCHAR(64) NOT NULL,
    recipient_host VARCHAR(255) NOT NULL,
    outcome VARCHAR(16) NOT NULL,
    code VARCHAR(64),
    created TIMESTAMP WITH TIME ZONE NOT NULL,
    -- Whom to tell on the sender's host: a `shown` receipt can come days after the send.
    sender_session VARCHAR(64),
    -- An acknowledgement's note (models.ACK_NOTE_CHARS).
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
    seq BIGSERIAL NOT NULL,
    message_id VARCHAR(128) NOT NULL,
    recipient_host VARCHAR(255) NOT NULL,
    recipient_session VARCHAR(64) NOT NULL,
    state VARCHAR(16) NOT NULL,
    reason VARCHAR(64),
    expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
    finished_at TIMESTAMP WITH TIME ZONE,
    CONSTRAINT pk_deliveries PRIMARY KEY (seq),
    CONSTRAINT ck_deliveries_state_valid
        CHECK (state IN ('queued', 'delivered', 'refused', 'expired')),
    CONSTRAINT fk_deliveries_message_id_messages
        FOREIGN KEY (message_id) REFERENCES messages (message_id),
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
    -- The session's wake policy, for senders on other hosts; NULL means 'every'.
    wake VARCHAR(16),
    CONSTRAINT pk_roster PRIMARY KEY (host_id, session_id),
    CONSTRAINT fk_roster_host_id_hosts FOREIGN KEY (host_id) REFERENCES hosts (host_id)
);
-- A session id belongs to one host.
CREATE UNIQUE INDEX uq_roster_session_id ON roster (session_id);

-- Which database role is which host's relay (`crossintercom db grant-host`).
CREATE TABLE host_roles (
    role_name VARCHAR(63) NOT NULL,
    host_id VARCHAR(255) NOT NULL,
    CONSTRAINT pk_host_roles PRIMARY KEY (role_name),
    CONSTRAINT uq_host_roles_host_id UNIQUE (host_id)
);

-- The archive (docs/archive.md): the admin's alone, no host role reads it.
CREATE TABLE archive_settings (
    id INTEGER NOT NULL,
    enabled BOOLEAN NOT NULL,
    retention_s INTEGER NOT NULL,
    CONSTRAINT pk_archive_settings PRIMARY KEY (id),
    CONSTRAINT ck_archive_settings_single_row CHECK (id = 1)
);

CREATE TABLE archive_messages (
    seq BIGSERIAL NOT NULL,
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
    sent_at TIMESTAMP WITH TIME ZONE NOT NULL,
    archived_at TIMESTAMP WITH TIME ZONE NOT NULL,
    payload JSON NOT NULL,
    CONSTRAINT pk_archive_messages PRIMARY KEY (seq),
    CONSTRAINT uq_archive_messages_message_id UNIQUE (message_id)
);
CREATE INDEX ix_archive_messages_thread_id ON archive_messages (thread_id, seq);
CREATE INDEX ix_archive_messages_sender_host ON archive_messages (sender_host);
CREATE INDEX ix_archive_messages_archived_at ON archive_messages (archived_at);
-- The full-text index, outside the metadata (tables.include_name).
CREATE INDEX ix_archive_messages_fts ON archive_messages USING gin
    (to_tsvector('english'::regconfig, coalesce(subject, '') || ' ' || body));

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

-- Path reservations (docs/agents.md#path-reservations).
CREATE TABLE reservations (
    id VARCHAR(64) NOT NULL,
    project VARCHAR(255) NOT NULL,
    glob TEXT NOT NULL,
    mode VARCHAR(16) NOT NULL,
    host_id VARCHAR(255) NOT NULL,
    session_id VARCHAR(64) NOT NULL,
    generation BIGINT NOT NULL,
    reason TEXT,
    created TIMESTAMP WITH TIME ZONE NOT NULL,
    expires_at TIMESTAMP WITH TIME ZONE NOT NULL,
    CONSTRAINT pk_reservations PRIMARY KEY (id),
    CONSTRAINT uq_reservations_project_host_id_session_id_glob
        UNIQUE (project, host_id, session_id, glob),
    CONSTRAINT ck_reservations_mode_valid CHECK (mode IN ('exclusive', 'shared'))
);
CREATE INDEX ix_reservations_host_id ON reservations (host_id, session_id);

-- hosts.beat_at: stamped on every claim and heartbeat, so no host can make itself look alive.
-- Its own search_path and a qualified now(): a host role's session cannot shadow it.
CREATE FUNCTION crossintercom_host_beat_at() RETURNS trigger LANGUAGE plpgsql
    SET search_path = pg_catalog, pg_temp
    AS $$ BEGIN NEW.beat_at := pg_catalog.now(); RETURN NEW; END $$;
CREATE TRIGGER hosts_beat_at BEFORE INSERT OR UPDATE OF heartbeat, generation ON hosts
    FOR EACH ROW EXECUTE FUNCTION crossintercom_host_beat_at();

-- --- per-host roles --------------------------------------------------------------------------

-- Every host role is a member of this NOLOGIN group. Roles are cluster-wide: another database
-- of the same server may have made it already.
DO $$ BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'crossintercom_hosts') THEN
        CREATE ROLE crossintercom_hosts NOLOGIN;
    END IF;
EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
END $$;

-- The functions the policies call. SECURITY DEFINER: they run as the owner, so a policy can
-- consult host_roles, messages and deliveries without recursing into their own policies. Each
-- names every object by schema and runs with its own search_path, and spells its operators
-- OPERATOR(pg_catalog.=): no temporary table, view or function of a caller stands in.

-- The host id of the connected role, NULL for any other role (session_user: inside a SECURITY
-- DEFINER function current_user is the owner).
CREATE FUNCTION public.crossintercom_host() RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT r.host_id::text FROM public.host_roles AS r
       WHERE r.role_name::text OPERATOR(pg_catalog.=) session_user::text $$;
-- The sending host of a message.
CREATE FUNCTION public.crossintercom_sender(mid text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT m.sender_host::text FROM public.messages AS m
       WHERE m.message_id::text OPERATOR(pg_catalog.=) mid $$;
-- Whether a message has a delivery to the role's host.
CREATE FUNCTION public.crossintercom_addressed(mid text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (SELECT 1 FROM public.deliveries AS d
                      WHERE d.message_id::text OPERATOR(pg_catalog.=) mid
                        AND d.recipient_host::text OPERATOR(pg_catalog.=) public.crossintercom_host()) $$;
-- Whether the role's host received the message for that session (from that sender session).
CREATE FUNCTION public.crossintercom_received(mid text, session text, sender_session text)
    RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (
           SELECT 1 FROM public.deliveries AS d
           JOIN public.messages AS m ON m.message_id::text OPERATOR(pg_catalog.=) d.message_id::text
           WHERE d.message_id::text OPERATOR(pg_catalog.=) mid
             AND d.recipient_session::text OPERATOR(pg_catalog.=) session
             AND d.recipient_host::text OPERATOR(pg_catalog.=) public.crossintercom_host()
             AND (sender_session IS NULL
                  OR (m.payload OPERATOR(pg_catalog.->) 'from')
                     OPERATOR(pg_catalog.->>) 'id' OPERATOR(pg_catalog.=) sender_session)) $$;
-- True once any host role exists: wake-ups then carry no rows (queries._PG_RECEIPT_HINTS).
CREATE FUNCTION public.crossintercom_private_hints() RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (SELECT 1 FROM public.host_roles) $$;
REVOKE ALL ON FUNCTION public.crossintercom_host(), public.crossintercom_sender(text),
    public.crossintercom_addressed(text), public.crossintercom_received(text, text, text),
    public.crossintercom_private_hints() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION public.crossintercom_host(), public.crossintercom_sender(text),
    public.crossintercom_addressed(text), public.crossintercom_received(text, text, text)
    TO crossintercom_hosts;
GRANT EXECUTE ON FUNCTION public.crossintercom_private_hints() TO PUBLIC;

-- What a host role may touch at all; the policies below say which rows. UPDATE column by
-- column: only what the relay's statements change (docs/operations.md, "Trust model").
GRANT SELECT, INSERT, DELETE ON hosts, roster, messages, deliveries, receipts
    TO crossintercom_hosts;
GRANT UPDATE (generation, heartbeat, machine, roster_rev) ON hosts TO crossintercom_hosts;
GRANT UPDATE (state, reason, finished_at) ON deliveries TO crossintercom_hosts;
-- No UPDATE: a host renews a reservation by deleting and inserting.
GRANT SELECT, INSERT, DELETE ON reservations TO crossintercom_hosts;
GRANT SELECT ON settings, alembic_version TO crossintercom_hosts;
GRANT USAGE ON SEQUENCE receipts_id_seq, deliveries_seq_seq TO crossintercom_hosts;

ALTER TABLE hosts ENABLE ROW LEVEL SECURITY;
ALTER TABLE roster ENABLE ROW LEVEL SECURITY;
ALTER TABLE messages ENABLE ROW LEVEL SECURITY;
ALTER TABLE deliveries ENABLE ROW LEVEL SECURITY;
ALTER TABLE receipts ENABLE ROW LEVEL SECURITY;
ALTER TABLE reservations ENABLE ROW LEVEL SECURITY;

-- --- row-security policies -------------------------------------------------------------------
-- Every policy needs the role mapped in this store's host_roles: a role of another store on
-- the same server reads no row here.

-- Leases and the roster: read by every host of this store, written by each host for itself.
CREATE POLICY hosts_read ON public.hosts FOR SELECT TO crossintercom_hosts
    USING ((SELECT public.crossintercom_host()) IS NOT NULL);
CREATE POLICY hosts_claim ON public.hosts FOR INSERT TO crossintercom_hosts
    WITH CHECK (host_id = (SELECT public.crossintercom_host()));
CREATE POLICY hosts_bump ON public.hosts FOR UPDATE TO crossintercom_hosts
    USING (host_id = (SELECT public.crossintercom_host()))
    WITH CHECK (host_id = (SELECT public.crossintercom_host()));
CREATE POLICY roster_read ON public.roster FOR SELECT TO crossintercom_hosts
    USING ((SELECT public.crossintercom_host()) IS NOT NULL);
CREATE POLICY roster_write ON public.roster FOR INSERT TO crossintercom_hosts
    WITH CHECK (host_id = (SELECT public.crossintercom_host()));
CREATE POLICY roster_remove ON public.roster FOR DELETE TO crossintercom_hosts
    USING (host_id = (SELECT public.crossintercom_host()));

-- Messages: written only as one's own host; read when sent by it or addressed to it.
CREATE POLICY messages_send ON public.messages FOR INSERT TO crossintercom_hosts
    WITH CHECK (sender_host = (SELECT public.crossintercom_host()));
CREATE POLICY messages_read ON public.messages FOR SELECT TO crossintercom_hosts
    USING (sender_host = (SELECT public.crossintercom_host())
           OR public.crossintercom_addressed(message_id));
CREATE POLICY messages_purge ON public.messages FOR DELETE TO crossintercom_hosts
    USING (sender_host = (SELECT public.crossintercom_host()));

-- Deliveries: made only for one's own messages, with a known state and reason; read and
-- finished by their recipient's host or their sender's; deleted by either once finished (a
-- queued delivery is deleted by no host role: its sender would never hear of it).
CREATE POLICY deliveries_send ON public.deliveries FOR INSERT TO crossintercom_hosts
    WITH CHECK (public.crossintercom_sender(message_id) = (SELECT public.crossintercom_host())
                AND state = ANY(ARRAY['queued', 'delivered', 'refused', 'expired']::text[])
                AND (reason IS NULL OR reason = ANY(@CODES@)));
CREATE POLICY deliveries_read ON public.deliveries FOR SELECT TO crossintercom_hosts
    USING (recipient_host = (SELECT public.crossintercom_host())
           OR public.crossintercom_sender(message_id) = (SELECT public.crossintercom_host()));
CREATE POLICY deliveries_finish ON public.deliveries FOR UPDATE TO crossintercom_hosts
    USING (recipient_host = (SELECT public.crossintercom_host())
           OR public.crossintercom_sender(message_id) = (SELECT public.crossintercom_host()))
    WITH CHECK ((recipient_host = (SELECT public.crossintercom_host())
                 OR public.crossintercom_sender(message_id) = (SELECT public.crossintercom_host()))
                AND (reason IS NULL OR reason = ANY(@CODES@)));
CREATE POLICY deliveries_purge ON public.deliveries FOR DELETE TO crossintercom_hosts
    USING ((recipient_host = (SELECT public.crossintercom_host())
            OR public.crossintercom_sender(message_id) = (SELECT public.crossintercom_host()))
           AND state <> 'queued');

-- Receipts: written by the sender's host about its own message, or by the recipient's host
-- for a delivery to it of that message; a known outcome and code; a note on an acknowledgement
-- only. Read by both hosts; deleted by the sender's host, or by the recipient's once the
-- store's retention has passed (the purge of receipts whose sender is gone).
CREATE POLICY receipts_write ON public.receipts FOR INSERT TO crossintercom_hosts
    WITH CHECK (outcome = ANY(@RECEIPT_OUTCOMES@)
                AND (code IS NULL OR code = ANY(@CODES@))
                AND ((sender_host = (SELECT public.crossintercom_host())
                      AND public.crossintercom_sender(message_id) = (SELECT public.crossintercom_host())
                      AND sender_session IS NULL)
                     OR (recipient_host = (SELECT public.crossintercom_host())
                         AND sender_host = public.crossintercom_sender(message_id)
                         AND public.crossintercom_received(message_id, recipient_session,
                                                           sender_session)))
                AND (note IS NULL OR outcome = 'acknowledged'));
CREATE POLICY receipts_read ON public.receipts FOR SELECT TO crossintercom_hosts
    USING (sender_host = (SELECT public.crossintercom_host())
           OR recipient_host = (SELECT public.crossintercom_host()));
CREATE POLICY receipts_consume ON public.receipts FOR DELETE TO crossintercom_hosts
    USING (sender_host = (SELECT public.crossintercom_host())
           OR (recipient_host = (SELECT public.crossintercom_host())
               AND created < pg_catalog.now() - pg_catalog.make_interval(
                   secs => (SELECT s.retention_s FROM public.settings AS s WHERE s.id = 1))));

-- Reservations: every host of the store reads them all; a host makes rows only as itself, at
-- its current generation (the fence a relay's statement applies), and deletes only its own.
CREATE POLICY reservations_read ON public.reservations FOR SELECT TO crossintercom_hosts
    USING ((SELECT public.crossintercom_host()) IS NOT NULL);
CREATE POLICY reservations_make ON public.reservations FOR INSERT TO crossintercom_hosts
    WITH CHECK (host_id = (SELECT public.crossintercom_host())
                AND generation = (SELECT h.generation FROM public.hosts AS h
                                  WHERE h.host_id = (SELECT public.crossintercom_host())));
CREATE POLICY reservations_release ON public.reservations FOR DELETE TO crossintercom_hosts
    USING (host_id = (SELECT public.crossintercom_host()));

-- --- revision 0017: each host's crossintercom version and its relay's last error -------------
-- Written by the host's relay into its own row (its version at each claim, an error only when
-- it changes); shown by `status --all-hosts`, which reads them as another host's words
-- (docs/operations.md, "Monitoring"). Bounded here, so a host role writes no more.

ALTER TABLE hosts ADD COLUMN version VARCHAR(64);
ALTER TABLE hosts ADD COLUMN last_error_code VARCHAR(64);
ALTER TABLE hosts ADD COLUMN last_error VARCHAR(200);
ALTER TABLE hosts ADD COLUMN last_error_at TIMESTAMP WITH TIME ZONE;
-- Its own row only: hosts_bump's USING and WITH CHECK hold every UPDATE to it.
GRANT UPDATE (version, last_error_code, last_error, last_error_at) ON hosts
    TO crossintercom_hosts;

-- --- revision 0018: a delivery a host role finishes leaves its sender a receipt ------------
-- No host role finishes a delivery without the receipt its sender's host reads: a queued
-- delivery that a host role sets to delivered, refused or expired must have, when its
-- transaction commits, a receipt of that outcome for that message and session (every relay's
-- ack, expiry and `forget` writes it in the same statement or transaction). And a host role's
-- receipt is dated by the database's clock, so the recipient's host cannot date one past the
-- retention and delete it at once (receipts_consume). So the recipient's host can no longer
-- finish a queued delivery and delete it unheard (docs/operations.md, "Deleting"). A host
-- role is a member of crossintercom_hosts, asked of the catalog (not crossintercom_host(): a
-- call per row would count against the policies' few per message); the shared role and the
-- admin are trusted with every row.
CREATE FUNCTION public.crossintercom_finish_told() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    -- By the sender's host: the receipts index (sender_host, id) holds the few it has not read.
    IF pg_catalog.pg_has_role(session_user, 'crossintercom_hosts', 'MEMBER') AND NOT EXISTS (
        SELECT 1 FROM public.receipts AS r JOIN public.messages AS m
            ON m.sender_host::text OPERATOR(pg_catalog.=) r.sender_host::text
        WHERE m.message_id::text OPERATOR(pg_catalog.=) NEW.message_id::text
          AND r.message_id::text OPERATOR(pg_catalog.=) NEW.message_id::text
          AND r.recipient_session::text OPERATOR(pg_catalog.=) NEW.recipient_session::text
          AND r.outcome::text OPERATOR(pg_catalog.=) NEW.state::text) THEN
        -- A fixed text: the file runs through the driver, which reads a percent sign as a parameter.
        RAISE EXCEPTION 'a delivery finished without its receipt to its sender''s host'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;
-- Checked at commit: the relay's statements finish the row before they write its receipt.
CREATE CONSTRAINT TRIGGER deliveries_finish_told AFTER UPDATE OF state ON deliveries
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state = 'queued' AND NEW.state <> 'queued')
    EXECUTE FUNCTION public.crossintercom_finish_told();
CREATE FUNCTION public.crossintercom_receipt_created() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    IF pg_catalog.pg_has_role(session_user, 'crossintercom_hosts', 'MEMBER') THEN
        NEW.created := pg_catalog.now();
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER receipts_created BEFORE INSERT ON receipts
    FOR EACH ROW EXECUTE FUNCTION public.crossintercom_receipt_created();
REVOKE ALL ON FUNCTION public.crossintercom_finish_told(),
    public.crossintercom_receipt_created() FROM PUBLIC;
-- --- revision 0019: host roles' checks made cheaper, and skipped for superusers ---------------
-- 0018's functions asked pg_has_role, which counts a superuser a member of every role: a relay
-- connected as a superuser (the trusted admin, like the shared role) paid a check meant for
-- host roles, and had its receipts redated. The test moves into the triggers' WHEN, so for
-- anyone else no event is queued or fired at all. is_superuser is the current role's, which no
-- host role can make a superuser's. And the check scanned every receipt the sender's host had
-- not read yet, so a host role's acks slowed as they piled up (a sender's host down for an
-- hour); the receipt it looks for was written in the same transaction, among the sender's
-- newest, so it reads them newest first and stops at the first (docs/performance.md, "Row
-- security's cost per message").
CREATE OR REPLACE FUNCTION public.crossintercom_finish_told() RETURNS trigger LANGUAGE plpgsql
    SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS $$
BEGIN
    -- Host roles only: the trigger's WHEN says who. A plain SELECT, not EXISTS: the planner
    -- drops an EXISTS subquery's ORDER BY.
    PERFORM 1 FROM public.receipts AS r
    WHERE r.sender_host::text OPERATOR(pg_catalog.=) (
              SELECT m.sender_host::text FROM public.messages AS m
              WHERE m.message_id::text OPERATOR(pg_catalog.=) NEW.message_id::text)
      AND r.message_id::text OPERATOR(pg_catalog.=) NEW.message_id::text
      AND r.recipient_session::text OPERATOR(pg_catalog.=) NEW.recipient_session::text
      AND r.outcome::text OPERATOR(pg_catalog.=) NEW.state::text
    ORDER BY r.id DESC LIMIT 1;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'a delivery finished without its receipt to its sender''s host'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER deliveries_finish_told ON deliveries;
CREATE CONSTRAINT TRIGGER deliveries_finish_told AFTER UPDATE OF state ON deliveries
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (OLD.state = 'queued' AND NEW.state <> 'queued'
          AND NOT pg_catalog.current_setting('is_superuser')::boolean
          AND pg_catalog.pg_has_role(session_user, 'crossintercom_hosts', 'MEMBER'))
    EXECUTE FUNCTION public.crossintercom_finish_told();
DROP TRIGGER receipts_created ON receipts;
CREATE TRIGGER receipts_created BEFORE INSERT ON receipts FOR EACH ROW
    WHEN (NOT pg_catalog.current_setting('is_superuser')::boolean
          AND pg_catalog.pg_has_role(session_user, 'crossintercom_hosts', 'MEMBER'))
    EXECUTE FUNCTION public.crossintercom_receipt_created();
-- The row-dependent functions the policies call per row asked crossintercom_host(), a second
-- owner-rights call per row; they read host_roles themselves (one lookup in the same query).
-- Same answers; a host role's fetch and ack of 32 messages about a fifth faster (docs/perf-log).
CREATE OR REPLACE FUNCTION public.crossintercom_addressed(mid text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (SELECT 1 FROM public.deliveries AS d JOIN public.host_roles AS h
                          ON h.host_id::text OPERATOR(pg_catalog.=) d.recipient_host::text
                      WHERE d.message_id::text OPERATOR(pg_catalog.=) mid
                        AND h.role_name::text OPERATOR(pg_catalog.=) session_user::text) $$;
CREATE OR REPLACE FUNCTION public.crossintercom_received(
    mid text, session text, sender_session text) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, public, pg_temp AS
    $$ SELECT EXISTS (
           SELECT 1 FROM public.deliveries AS d
           JOIN public.messages AS m ON m.message_id::text OPERATOR(pg_catalog.=) d.message_id::text
           JOIN public.host_roles AS h
               ON h.host_id::text OPERATOR(pg_catalog.=) d.recipient_host::text
           WHERE d.message_id::text OPERATOR(pg_catalog.=) mid
             AND d.recipient_session::text OPERATOR(pg_catalog.=) session
             AND h.role_name::text OPERATOR(pg_catalog.=) session_user::text
             AND (sender_session IS NULL
                  OR (m.payload OPERATOR(pg_catalog.->) 'from')
                     OPERATOR(pg_catalog.->>) 'id' OPERATOR(pg_catalog.=) sender_session)) $$;
