-- The floor's D1 schema: the contract's `sessions` and `messages` columns and
-- nothing else, WITHOUT ROWID like the gateway's, and the one index needed to
-- find a key's newest session.
CREATE TABLE sessions (
	id text PRIMARY KEY NOT NULL,
	session_key text NOT NULL,
	started_at integer NOT NULL,
	last_active_at integer NOT NULL,
	ended_at integer,
	end_reason text,
	parent_session_id text,
	message_count integer DEFAULT 0 NOT NULL
) WITHOUT ROWID;
CREATE INDEX sessions_key_started ON sessions (session_key, started_at);
CREATE TABLE messages (
	session_id text NOT NULL,
	seq integer NOT NULL,
	role text NOT NULL,
	text text NOT NULL,
	created_at integer NOT NULL,
	PRIMARY KEY (session_id, seq)
) WITHOUT ROWID;
