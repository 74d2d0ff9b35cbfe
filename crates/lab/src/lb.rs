//! The load balancer at a child cluster's control-plane endpoint: HAProxy (Debian's package) on
//! the lab gateway side, at the endpoint address, forwarding TCP to the API servers of the
//! control-plane hosts that answer `/readyz`. A real site with `loadBalancer: external` has its
//! own load balancer doing the same.

use std::net::Ipv4Addr;
use std::path::Path;
use std::time::{Duration, Instant};

use bootsman_testenv::process::Component;

use crate::error::{Error, Result, io};
use crate::{Lab, net};

/// A running HAProxy.
#[derive(Debug)]
pub struct LoadBalancer {
    process: Component,
    vip: Ipv4Addr,
    port: u16,
}

impl LoadBalancer {
    /// Serves `vip:port`, with one backend per `(name, address)`, health-checked by
    /// `GET /readyz` over TLS every second.
    pub fn start(
        lab: &Lab,
        vip: Ipv4Addr,
        port: u16,
        backends: &[(String, Ipv4Addr)],
    ) -> Result<LoadBalancer> {
        net::add_address(vip)?;
        let mut cfg = format!(
            "# HAProxy at the control-plane endpoint {vip}:{port} of a lab child cluster.
global
  maxconn 4096
defaults
  mode tcp
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  timeout check 3s
frontend apiserver
  bind {vip}:{port}
  default_backend control-plane
backend control-plane
  option httpchk GET /readyz
  http-check expect status 200
  default-server inter 1s fall 2 rise 1 check check-ssl verify none
"
        );
        for (name, addr) in backends {
            cfg.push_str(&format!("  server {name} {addr}:6443\n"));
        }
        let path = lab.dir().join(format!("haproxy-{vip}.cfg"));
        std::fs::write(&path, cfg).map_err(io("write", &path))?;
        let process = Component::spawn(
            &format!("haproxy {vip}"),
            Path::new("haproxy"),
            &["-f".into(), path.display().to_string(), "-db".into()],
            &[],
            lab.dir().join(format!("haproxy-{vip}.log")),
        )?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect((vip, port)).is_err() {
            process.check_running()?;
            if Instant::now() > deadline {
                return Err(Error::Timeout {
                    what: format!("HAProxy listening at {vip}:{port}"),
                    secs: 10,
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(LoadBalancer { process, vip, port })
    }

    /// The endpoint served.
    pub fn endpoint(&self) -> (Ipv4Addr, u16) {
        (self.vip, self.port)
    }

    /// Fails with the log tail if HAProxy stopped.
    pub fn check_running(&self) -> Result<()> {
        Ok(self.process.check_running()?)
    }
}
