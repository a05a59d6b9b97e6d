// crossintercom: start a turn when mail arrives for the session NAME below (written by
// `crossintercom setup opencode`; edit it there, not here). While a session is idle, one
// `crossintercom wait` runs; when it prints mail, that text (framed as another agent's words)
// becomes the session's next prompt. Mail that arrives while the session is busy is held for
// its next idle moment.
import { spawn } from "node:child_process";

const COMMAND = __COMMAND__;
const ENV = __ENV__;
const NAME = __NAME__;
const WAIT_S = __WAIT_S__;
const EXIT_MAIL = 0;
const EXIT_TIMEOUT = 6;

export const CrossintercomMail = async ({ client }) => {
  let waiter = null; // the running `crossintercom wait`
  let idle = null; // the idle session to wake, if any
  const held = []; // mail printed while no session was idle

  const deliver = async (sessionID, text) => {
    await client.session.prompt({
      path: { id: sessionID },
      body: { parts: [{ type: "text", text }] },
    });
  };

  const wait = () => {
    if (waiter !== null) return;
    const args = [...COMMAND.slice(1), "wait", "--as", NAME, "--format", "text"];
    waiter = spawn(COMMAND[0], [...args, "--timeout", String(WAIT_S), "--replace"], {
      env: { ...process.env, ...ENV },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    waiter.stdout.on("data", (chunk) => {
      out += chunk;
    });
    waiter.on("close", async (code) => {
      waiter = null;
      if (code === EXIT_MAIL && out.trim()) {
        if (idle !== null) {
          const id = idle;
          idle = null;
          await deliver(id, out);
        } else {
          held.push(out);
        }
      } else if (code === EXIT_TIMEOUT && idle !== null) {
        wait(); // nothing came: keep waiting while the session stays idle
      }
    });
  };

  return {
    event: async ({ event }) => {
      const props = event.properties ?? {};
      if (event.type === "session.idle") {
        const id = props.sessionID ?? event.sessionID;
        if (held.length > 0) {
          await deliver(id, held.splice(0).join("\n\n"));
          return;
        }
        idle = id;
        wait();
      } else if (event.type === "session.status" && props.status?.type === "busy") {
        idle = null;
      }
    },
  };
};
