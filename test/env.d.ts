declare namespace Cloudflare {
  interface Env {
    TEST_MIGRATIONS: import("cloudflare:test").D1Migration[];
    GENERIC_WEBHOOK_SECRET: string;
    ADMIN_TOKEN: string;
  }
}
