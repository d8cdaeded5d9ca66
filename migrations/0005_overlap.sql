ALTER TABLE `messages` ADD `not_dispatched` text;--> statement-breakpoint
ALTER TABLE `runs` ADD `messages` text;