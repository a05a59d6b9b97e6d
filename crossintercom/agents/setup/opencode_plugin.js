// crossintercom: start a turn when mail arrives for the session NAME below (written by
// `crossintercom setup opencode`; edit it there, not here). While a session is idle, one
// `crossintercom wait` runs; when it prints mail, that text (framed as another agent's words)
// becomes the session's next prompt, started with promptAsync so the plugin never holds a turn
// open. Mail that arrives while the session is busy is held for its next idle moment. A one-shot
// `opencode run` starts no waiter (it ends as it would without crossintercom), and the waiter
// ends with OpenCode however OpenCode ends. See docs/agents.md#opencode.
import { spawn } from "node:child_process";

const COMMAND = __COMMAND__;
const ENV = __ENV__;
const NAME = __NAME__;
const WAIT_S = __WAIT_S__;
const EXIT_MAIL = 0;
const EXIT_TIMEOUT = 6;

// `opencode run ...` answers its prompt and exits: the first word after the options is "run".
const oneShot = () => process.argv.slice(2).find((arg) => !arg.startsWith("-")) === "run";

export const CrossintercomMail = async ({ client }) => {
  const active = !oneShot();
  let disposed = false;
  let waiter = null; // the running `crossintercom wait`
  let idle = null; // the idle session to wake, if any
  const held = []; // mail printed while no session was idle

  const deliver = async (sessionID, text) => {
    try {
      await client.session.promptAsync({
        path: { id: sessionID },
        body: { parts: [{ type: "text", text }] },
      });
    } catch {
      held.push(text); // not accepted (the server is going away): kept for the next idle
    }
  };

  // A subagent's session (the task tool's) goes idle while its parent still works: not the
  // session to wake.
  const isSubagent = async (sessionID) => {
    try {
      const got = await client.session.get({ path: { id: sessionID } });
      return Boolean(got?.data?.parentID);
    } catch {
      return false;
    }
  };

  const wait = (replace) => {
    if (!active || disposed || waiter !== null) return;
    const args = [...COMMAND.slice(1), "wait", "--as", NAME, "--format", "text"];
    args.push("--timeout", String(WAIT_S), ...(replace ? ["--replace"] : []));
    const child = spawn(COMMAND[0], args, {
      // The lifeline ends the waiter when this OpenCode process ends, however it ends.
      env: { ...process.env, ...ENV, CROSSINTERCOM_HARNESS_PID: String(process.pid) },
      stdio: ["ignore", "pipe", "ignore"],
    });
    waiter = child;
    let out = "";
    child.stdout.setEncoding("utf8"); // a character split between two reads stays whole
    child.stdout.on("data", (chunk) => {
      out += chunk;
    });
    child.on("error", () => {
      if (waiter === child) waiter = null;
    });
    child.on("close", async (code) => {
      if (waiter !== child) return;
      waiter = null;
      if (disposed) return;
      if (code === EXIT_MAIL && out.trim()) {
        if (idle !== null) {
          const id = idle;
          idle = null;
          await deliver(id, out);
        } else {
          held.push(out);
        }
      } else if (code === EXIT_TIMEOUT && idle !== null) {
        wait(false); // nothing came: keep waiting while the session stays idle
      }
    });
  };

  return {
    event: async ({ event }) => {
      if (!active || disposed) return;
      const props = event.properties ?? {};
      if (event.type === "session.idle") {
        const id = props.sessionID ?? event.sessionID;
        if (await isSubagent(id)) return;
        if (held.length > 0) {
          await deliver(id, held.splice(0).join("\n\n"));
          return;
        }
        idle = id;
        wait(true);
      } else if (event.type === "session.status" && props.status?.type === "busy") {
        if (props.sessionID === undefined || props.sessionID === idle) idle = null;
      }
    },
    dispose: async () => {
      disposed = true;
      const child = waiter;
      waiter = null;
      if (child !== null && child.exitCode === null) child.kill("SIGTERM");
    },
  };
};
