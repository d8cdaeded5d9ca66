/** The typed way to reach a key's routing object. */
import type { SessionRouter } from "./router";

export function routerFor(env: Env, sessionKey: string): DurableObjectStub<SessionRouter> {
  return env.ROUTER.getByName(sessionKey);
}
