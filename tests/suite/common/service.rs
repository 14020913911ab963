//! An example (the edge service, the ledger consumer) as a real process, for the tests that
//! kill it: each test binary re-runs itself with `<entry> --ignored` (its own entry point,
//! which runs the example's `main`), reads the address it prints, and talks to it over
//! loopback.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::sync::mpsc::{Receiver, RecvTimeoutError, channel};
use std::time::{Duration, Instant};

/// How long a child may take to print what a test waits for.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// A running service: the child, its address, and its stdout lines.
pub struct Service {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    lines: Mutex<Receiver<String>>,
    /// A client that answers every status (4xx and 5xx are answers here, not errors).
    pub agent: ureq::Agent,
}

impl Service {
    /// Starts the service on an ephemeral port with its data in `data`: no lost processor
    /// answers and no completer unless `env` (applied last) says otherwise.
    /// `entry` is the full test name of the caller's service entry (`child_test!`).
    pub fn start(
        entry: &str,
        data: &Path,
        env: &[(&str, &str)],
    ) -> Result<Service, Box<dyn std::error::Error>> {
        let data = data.to_str().ok_or("a data path that is not UTF-8")?;
        let mut all = vec![
            ("EDGE_SERVICE_CHILD", "1"),
            ("EDGE_ADDR", "127.0.0.1:0"),
            ("EDGE_DATA", data),
            ("EDGE_TIMEOUT_RATE", "0"),
            // The completer only where a test asks for it: it would race the retries the
            // tests make themselves.
            ("EDGE_COMPLETE_EVERY_MS", "3600000"),
        ];
        all.extend_from_slice(env);
        Service::spawn(entry, &all)
    }

    /// Runs this test binary's ignored test `entry` as a child with `env`, and waits for it
    /// to print `listening on <base>`.
    pub fn spawn(entry: &str, env: &[(&str, &str)]) -> Result<Service, Box<dyn std::error::Error>> {
        let mut command = Command::new(std::env::current_exe()?);
        command
            .args([
                entry,
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        for (name, value) in env {
            command.env(name, value);
        }
        let mut child = command.spawn()?;
        let stdout = child.stdout.take().ok_or("no stdout")?;
        let (send, lines) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if send.send(line).is_err() {
                    break;
                }
            }
        });
        let mut service = Service {
            child,
            base: String::new(),
            lines: Mutex::new(lines),
            agent: ureq::Agent::config_builder()
                .http_status_as_error(false)
                .build()
                .into(),
        };
        let listening = service.line_starting("listening on ")?;
        service.base = listening["listening on ".len()..].to_owned();
        Ok(service)
    }

    /// Waits for the child to print `prefix`; answers the line from there on.
    pub fn line_starting(&self, prefix: &str) -> Result<String, Box<dyn std::error::Error>> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let next = self
                .lines
                .lock()
                .map_err(|_| "poisoned")?
                .recv_timeout(left);
            match next {
                // The harness's "test service_process ... " may share the first line.
                Ok(line) if line.contains(prefix) => {
                    let at = line.find(prefix).unwrap_or(0);
                    return Ok(line[at..].to_owned());
                }
                Ok(_) => {}
                Err(RecvTimeoutError::Timeout) => return Err(format!("no `{prefix}` line").into()),
                Err(RecvTimeoutError::Disconnected) => {
                    return Err(format!("the service exited before printing `{prefix}`").into());
                }
            }
        }
    }

    /// Moves the service's manual clock (`EDGE_MANUAL_CLOCK=1`) forward.
    pub fn advance_clock(&self, seconds: u64) -> Result<(), Box<dyn std::error::Error>> {
        let url = format!("{}/_test/clock?advance_secs={seconds}", self.base);
        let mut answer = self.agent.post(url).send_empty()?;
        let status = answer.status().as_u16();
        if status != 200 {
            return Err(format!(
                "advancing the clock: {status} {}",
                answer.body_mut().read_to_string()?
            )
            .into());
        }
        Ok(())
    }

    /// Sends `signal` (`TERM`, `INT`) as a supervisor would, and waits for the process to
    /// exit, up to [`PATIENCE`]; its exit status.
    pub fn stop_with(
        &mut self,
        signal: &str,
    ) -> Result<std::process::ExitStatus, Box<dyn std::error::Error>> {
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &self.child.id().to_string()])
            .status()?;
        if !sent.success() {
            return Err(format!("kill -{signal} failed: {sent}").into());
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                return Err(format!("still running {PATIENCE:?} after SIG{signal}").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL: no destructor, no flush, no goodbye.
    pub fn kill(mut self) -> std::io::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An HTTP answer of a service, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: u16,
    /// `Idempotent-Replayed: true`.
    pub replayed: bool,
    /// `Retry-After`, in seconds.
    pub retry_after: Option<u64>,
    pub content_type: String,
    pub body: String,
}

impl Answer {
    pub fn read(mut response: ureq::http::Response<ureq::Body>) -> Result<Answer, ureq::Error> {
        let header = |name: &str| {
            response
                .headers()
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let replayed = header("idempotent-replayed").as_deref() == Some("true");
        let retry_after = header("retry-after").and_then(|v| v.parse().ok());
        let content_type = header("content-type").unwrap_or_default();
        Ok(Answer {
            status: response.status().as_u16(),
            replayed,
            retry_after,
            content_type,
            body: response.body_mut().read_to_string()?,
        })
    }

    /// The body as JSON.
    pub fn json(&self) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        serde_json::from_str(&self.body).map_err(|e| format!("{e}: not JSON: {}", self.body).into())
    }

    /// The problem type of a problem+json answer.
    pub fn problem(&self) -> Option<String> {
        if !self.content_type.starts_with("application/problem+json") {
            return None;
        }
        let json: serde_json::Value = serde_json::from_str(&self.body).ok()?;
        json["type"].as_str().map(str::to_owned)
    }
}
