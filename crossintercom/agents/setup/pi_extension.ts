// crossintercom: wake this Pi session when mail arrives for the session NAME below (written by
// `crossintercom setup pi`; edit it there, not here). In an interactive session (the TUI or RPC
// mode) one wait for mail runs at a time: `crossintercom wait`, or, set up with --gateway, a long
// poll of the gateway's /wait with fetch (nothing of crossintercom installed here). When it hands
// over mail, that text (framed as another agent's words) goes into the conversation as a
// crossintercom message, never as the user's, and starts a turn: at once when Pi is idle, after
// the current run when it is busy. One-shot runs (`pi --print`, `--mode json`) start nothing, so
// they end as they would without crossintercom. See docs/agents.md#pi.
import { spawn } from "node:child_process";
import type { ExtensionAPI } from "@earendil-works/pi-coding-agent";

const COMMAND: string[] = __COMMAND__;
const ENV: Record<string, string> = __ENV__;
const NAME: string = __NAME__;
const WAIT_S: number = __WAIT_S__;
// null, or the gateway's URL and the environment variable that holds its token.
const GATEWAY: { url: string; tokenEnv: string } | null = __GATEWAY__;
const EXIT_MAIL = 0;
const EXIT_TIMEOUT = 6;
// A gateway not reached (or failing) is asked again after this long.
const RETRY_MS = 5000;

__GATEWAY_POLL__

// The modes that stay up waiting for their user; "print" and "json" end after their prompts.
const LIVE_MODES = new Set(["tui", "rpc"]);

// How a wait ended: "mail" (its text), "again" (nothing came in time), "retry" (the gateway was
// not reached), or "stop" (anything else: the watch ends for this session).
type Ended = "mail" | "again" | "retry" | "stop";

export default function (pi: ExtensionAPI) {
  let live = false; // a session of this runtime is started and not shut down
  let waiter: { stop: () => void } | null = null;

  const stop = () => {
    live = false;
    const running = waiter;
    waiter = null;
    if (running !== null) running.stop();
  };

  const deliver = (text: string) => {
    try {
      pi.sendMessage(
        { customType: "crossintercom", content: text, display: true },
        { triggerTurn: true, deliverAs: "followUp" },
      );
    } catch {
      stop(); // this runtime is gone (reload, new session, exit): its successor waits instead
    }
  };

  const ended = (how: Ended, text: string) => {
    if (!live) return;
    if (how === "mail") {
      deliver(text);
      wait(false);
    } else if (how === "again") {
      wait(false);
    } else if (how === "retry") {
      setTimeout(() => wait(false), RETRY_MS).unref();
    }
    // "stop" (another waiter holds NAME, the token refused, an error) ends the watch.
  };

  const spawnWait = (replace: boolean, done: (how: Ended, text: string) => void) => {
    const args = [...COMMAND.slice(1), "wait", "--as", NAME, "--format", "text"];
    args.push("--timeout", String(WAIT_S), ...(replace ? ["--replace"] : []));
    const child = spawn(COMMAND[0], args, {
      // The lifeline ends the waiter when this Pi process ends, however it ends.
      env: { ...process.env, ...ENV, CROSSINTERCOM_HARNESS_PID: String(process.pid) },
      stdio: ["ignore", "pipe", "ignore"],
    });
    let out = "";
    child.stdout?.setEncoding("utf8");
    child.stdout?.on("data", (chunk: string) => {
      out += chunk;
    });
    child.on("error", () => done("stop", "")); // not startable: stay quiet rather than loop
    child.on("close", (code: number | null) => {
      if (code === EXIT_MAIL && out.trim()) done("mail", out);
      else done(code === EXIT_TIMEOUT ? "again" : "stop", "");
    });
    return {
      stop: () => {
        if (child.exitCode === null) child.kill("SIGTERM");
      },
    };
  };

  // The first waiter takes over from one a previous Pi left behind; later ones do not, so a
  // newer Pi running as the same NAME keeps the mail instead of trading it back and forth.
  const wait = (replace: boolean) => {
    if (!live || waiter !== null) return;
    let self: { stop: () => void } | null = null;
    const done = (how: Ended, text: string) => {
      if (waiter !== self) return;
      waiter = null;
      ended(how, text);
    };
    self = GATEWAY === null ? spawnWait(replace, done) : pollGateway(GATEWAY, WAIT_S, done);
    waiter = self;
  };

  pi.on("session_start", async (_event, ctx) => {
    if (!LIVE_MODES.has(ctx.mode)) return;
    live = true;
    wait(true);
  });

  pi.on("session_shutdown", async () => {
    stop();
  });
}
