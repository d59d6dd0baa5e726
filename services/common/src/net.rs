//! Network helpers: telling addresses a tenant must not make the gateway call.

use std::net::IpAddr;

/// Whether a URL's host is `localhost` (or a name under it) or a private, loopback, link-local,
/// unspecified or broadcast address, IPv4-mapped IPv6 included. Names are not resolved: a
/// registration is judged by what it says.
pub fn is_private_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(|address| match address {
            IpAddr::V4(v4) => v4.is_private() || v4.is_loopback() || v4.is_link_local() || v4.is_unspecified() || v4.is_broadcast(),
            IpAddr::V6(v6) => {
                v6.is_loopback()
                    || v6.is_unspecified()
                    || (v6.segments()[0] & 0xfe00) == 0xfc00
                    || (v6.segments()[0] & 0xffc0) == 0xfe80
                    || v6.to_ipv4_mapped().is_some_and(|v4| v4.is_private() || v4.is_loopback() || v4.is_link_local())
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_hosts_are_told_from_public_ones() {
        for private in
            ["localhost", "api.localhost", "127.0.0.1", "10.1.2.3", "169.254.169.254", "[::1]", "[fd00::1]", "[::ffff:10.0.0.1]", "0.0.0.0"]
        {
            assert!(is_private_host(private), "{private}");
        }
        for public in ["mcp.example.com", "8.8.8.8", "[2001:4860:4860::8888]"] {
            assert!(!is_private_host(public), "{public}");
        }
    }
}
