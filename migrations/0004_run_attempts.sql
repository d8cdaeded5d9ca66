ALTER TABLE `runs` ADD `attempts` integer DEFAULT 0 NOT NULL;--> statement-breakpoint
ALTER TABLE `runs` ADD `accepted_at` integer;--> statement-breakpoint
ALTER TABLE `runs` ADD `message` text;