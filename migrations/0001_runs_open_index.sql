DROP INDEX `runs_session`;--> statement-breakpoint
CREATE INDEX `runs_open` ON `runs` (`session_id`) WHERE "runs"."finished_at" IS NULL AND "runs"."revoked_reason" IS NULL;