import { afterEach, beforeEach, it } from "vitest";
import {
  HOUR,
  T0,
  genericKey,
  restoreClock,
  router,
  runAlarm,
  send,
  sessionRow,
  setNow,
  unique,
  useConfig,
} from "../helpers";
import { agentConfig, fakeServices, replyWith } from "../agent/support";

let services: ReturnType<typeof fakeServices>;
beforeEach(() => {
  setNow(T0);
  useConfig(agentConfig({ SESSION_RESET: JSON.stringify({ mode: "idle", idle_minutes: 90 }) }));
});
afterEach(() => {
  services?.restore();
  restoreClock();
  useConfig(null);
});

for (const hours of [1, 23, 30, 50]) {
  it(`a hand-off whose alarm first runs ${hours} h after the message`, async () => {
    services = fakeServices(() => replyWith("hi"));
    const chat = unique("chat");
    const key = genericKey(chat);
    const sent = await send({ chat_id: chat, text: "one" });
    setNow(T0 + hours * HOUR);
    await runAlarm(key);
    console.log(
      `${hours} h: agent calls ${services.agentCalls().length}, session ${(await sessionRow(sent.body.session_id))!.end_reason}, outbox ${JSON.stringify(await router(key).outbox())}`,
    );
  });
}
