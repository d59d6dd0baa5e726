//! Network helpers: telling addresses a tenant must not make the gateway call, and the HTTP client
//! for the URLs tenants give (MCP servers, guardrail endpoints, observability destinations).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// Whether a URL's host is `localhost` (or a name under it) or a private address
/// (`is_private_address`), IPv4-mapped IPv6 included. Names are not resolved here: a registration
/// is judged by what it says, and `tenant_http_client` judges what a name resolves to.
pub fn is_private_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost")
        || host.to_ascii_lowercase().ends_with(".localhost")
        || host.parse::<IpAddr>().is_ok_and(is_private_address)
}

/// Whether an address is one a tenant must not reach through the gateway: private, loopback,
/// link-local (cloud metadata services), unspecified, broadcast, "this network" (0.0.0.0/8), shared
/// (100.64.0.0/10, carrier NAT and some clouds' metadata), IETF protocol assignments (192.0.0.0/24),
/// benchmarking (198.18.0.0/15), IPv6 unique-local and link-local, and IPv4 addresses of those
/// kinds mapped or translated (NAT64, 64:ff9b::/96) into IPv6.
pub fn is_private_address(address: IpAddr) -> bool {
    match address {
        IpAddr::V4(v4) => is_private_v4(v4),
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_unspecified()
                || (v6.segments()[0] & 0xfe00) == 0xfc00
                || (v6.segments()[0] & 0xffc0) == 0xfe80
                || v6.to_ipv4_mapped().is_some_and(is_private_v4)
                || nat64_embedded(v6).is_some_and(is_private_v4)
        }
    }
}

fn is_private_v4(v4: Ipv4Addr) -> bool {
    let [first, second, third, _] = v4.octets();
    v4.is_private()
        || v4.is_loopback()
        || v4.is_link_local()
        || v4.is_unspecified()
        || v4.is_broadcast()
        || first == 0
        || (first == 100 && (64..128).contains(&second))
        || (first == 192 && second == 0 && third == 0)
        || (first == 198 && (18..20).contains(&second))
}

/// The IPv4 address a NAT64 address (64:ff9b::/96) stands for.
fn nat64_embedded(v6: Ipv6Addr) -> Option<Ipv4Addr> {
    let segments = v6.segments();
    (segments[..6] == [0x64, 0xff9b, 0, 0, 0, 0]).then(|| {
        let [.., high, low] = segments;
        Ipv4Addr::new((high >> 8) as u8, high as u8, (low >> 8) as u8, low as u8)
    })
}

/// A block of addresses written as CIDR (`10.0.0.0/8`, `fd00::/8`) or one address (a /32 or /128):
/// the peers an operator trusts, such as the proxies that forward client certificates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AddressRange {
    network: IpAddr,
    prefix: u8,
}

/// Why a text is not an address range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not an address or CIDR block (such as 10.0.0.0/8 or fd00::/8)")]
pub struct InvalidAddressRange(pub String);

impl std::str::FromStr for AddressRange {
    type Err = InvalidAddressRange;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let invalid = || InvalidAddressRange(text.to_string());
        let (address, prefix) = match text.trim().split_once('/') {
            Some((address, prefix)) => (address, Some(prefix)),
            None => (text.trim(), None),
        };
        let network: IpAddr = address.parse().map_err(|_| invalid())?;
        let width = if network.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            Some(prefix) if !prefix.is_empty() && prefix.bytes().all(|byte| byte.is_ascii_digit()) => {
                prefix.parse::<u8>().ok().filter(|prefix| *prefix <= width).ok_or_else(invalid)?
            }
            Some(_) => return Err(invalid()),
            None => width,
        };
        Ok(AddressRange { network: masked(network, prefix), prefix })
    }
}

impl std::fmt::Display for AddressRange {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}/{}", self.network, self.prefix)
    }
}

impl AddressRange {
    /// Whether `address` is in the block; an IPv4 address mapped into IPv6 (a dual-stack
    /// listener's view of an IPv4 peer) counts as the IPv4 address.
    pub fn contains(&self, address: IpAddr) -> bool {
        let address = address.to_canonical();
        address.is_ipv4() == self.network.is_ipv4() && masked(address, self.prefix) == self.network
    }
}

/// `address` with all but its first `prefix` bits cleared.
fn masked(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(v4) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(Ipv4Addr::from(u32::from(v4) & mask))
        }
        IpAddr::V6(v6) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(Ipv6Addr::from(u128::from(v6) & mask))
        }
    }
}

/// Why a URL a tenant gave is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlRefusal {
    #[error("not a URL")]
    NotUrl,
    #[error("not an http(s) URL")]
    NotHttp,
    #[error("no host")]
    NoHost,
    /// The host, as the URL writes it.
    #[error("`{0}` is localhost or a private, loopback or link-local address")]
    Private(String),
}

/// A URL a tenant gave (an MCP server, a guardrail endpoint, an observability destination): http(s)
/// with a host that `is_private_host` does not flag, unless `allow_private` (the operator's switch).
pub fn tenant_url(url: &str, allow_private: bool) -> Result<reqwest::Url, UrlRefusal> {
    let parsed = reqwest::Url::parse(url).map_err(|_| UrlRefusal::NotUrl)?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(UrlRefusal::NotHttp);
    }
    let host = parsed.host_str().ok_or(UrlRefusal::NoHost)?;
    if !allow_private && is_private_host(host) {
        return Err(UrlRefusal::Private(host.to_string()));
    }
    Ok(parsed)
}

/// A resolver that hands the HTTP client only public addresses: a name that resolves to nothing
/// else (a DNS name pointing at 127.0.0.1 or a cloud metadata address, an internal service name)
/// fails to connect, so a tenant's URL cannot reach the gateway's network by a name either. The
/// operator's egress proxies (`trusted`) resolve as they are: through one, the proxy resolves the
/// tenant's host, and the gateway's check is the URL's.
#[derive(Debug, Clone, Default)]
pub struct PublicAddressesOnly {
    trusted: std::sync::Arc<[String]>,
}

impl PublicAddressesOnly {
    /// Trusting the hosts of the proxies the environment names (`HTTPS_PROXY`, `HTTP_PROXY`,
    /// `ALL_PROXY`, either case), which the HTTP client uses.
    pub fn trusting_environment_proxies() -> Self {
        let hosts: Vec<String> = ["HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"]
            .iter()
            .filter_map(|name| std::env::var(name).ok())
            .filter_map(|proxy| {
                let proxy = if proxy.contains("://") { proxy } else { format!("http://{proxy}") };
                reqwest::Url::parse(&proxy).ok()?.host_str().map(str::to_ascii_lowercase)
            })
            .collect();
        PublicAddressesOnly { trusted: hosts.into() }
    }
}

impl reqwest::dns::Resolve for PublicAddressesOnly {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        let trusted = self.trusted.iter().any(|proxy| proxy.eq_ignore_ascii_case(&host));
        Box::pin(async move {
            let resolved: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            if trusted {
                return Ok(Box::new(resolved.into_iter()) as reqwest::dns::Addrs);
            }
            let public: Vec<SocketAddr> = resolved.into_iter().filter(|address| !is_private_address(address.ip())).collect();
            if public.is_empty() {
                let refused = std::io::Error::new(
                    std::io::ErrorKind::PermissionDenied,
                    format!("`{host}` resolves only to private, loopback or link-local addresses, which tenants' URLs may not reach"),
                );
                return Err(Box::new(refused) as Box<dyn std::error::Error + Send + Sync>);
            }
            Ok(Box::new(public.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Redirects followed within one origin (a server moving `/mcp` to `/mcp/`).
const MAX_SAME_ORIGIN_REDIRECTS: usize = 5;

/// The HTTP client for URLs a tenant gives: redirects followed only within the same origin
/// (scheme, host and port; a public server must not bounce the gateway's request elsewhere, its
/// network included) and, unless `allow_private` (the operator's switch), only public addresses
/// for the names it resolves. IP literals are not resolved: judge them with `is_private_host`
/// before calling.
pub fn tenant_http_client(allow_private: bool) -> reqwest::ClientBuilder {
    let same_origin = reqwest::redirect::Policy::custom(|attempt| {
        let origin = |url: &reqwest::Url| (url.scheme().to_string(), url.host_str().map(str::to_string), url.port_or_known_default());
        let first = attempt.previous().first().map(origin);
        if attempt.previous().len() <= MAX_SAME_ORIGIN_REDIRECTS && first == Some(origin(attempt.url())) {
            attempt.follow()
        } else {
            attempt.stop()
        }
    });
    let builder = reqwest::Client::builder().tcp_nodelay(true).redirect(same_origin);
    if allow_private { builder } else { builder.dns_resolver(std::sync::Arc::new(PublicAddressesOnly::trusting_environment_proxies())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_ranges_hold_the_addresses_of_their_block() {
        let range = |text: &str| text.parse::<AddressRange>().expect(text);
        let address = |text: &str| text.parse::<IpAddr>().expect(text);
        assert!(range("10.0.0.0/8").contains(address("10.255.1.2")));
        assert!(!range("10.0.0.0/8").contains(address("11.0.0.1")));
        assert!(range("10.1.2.3/8").contains(address("10.9.9.9")), "host bits are cleared");
        assert_eq!(range("10.1.2.3/8").to_string(), "10.0.0.0/8");
        assert!(range("127.0.0.1").contains(address("127.0.0.1")));
        assert!(!range("127.0.0.1").contains(address("127.0.0.2")));
        assert!(range("0.0.0.0/0").contains(address("203.0.113.9")));
        assert!(!range("0.0.0.0/0").contains(address("2001:db8::1")), "an IPv4 block holds no IPv6 address");
        assert!(range("127.0.0.1/32").contains(address("::ffff:127.0.0.1")), "mapped IPv4 is IPv4");
        assert!(range("fd00::/8").contains(address("fd12::1")));
        assert!(!range("fd00::/8").contains(address("fe80::1")));
        assert!(range("::/0").contains(address("::1")));
        for bad in ["", "10.0.0.0/33", "10.0.0.0/", "10.0.0.0/-1", "10.0.0.0/+8", "fd00::/129", "example.com", "10.0.0/8", "10.0.0.0/8/8"] {
            assert!(bad.parse::<AddressRange>().is_err(), "{bad}");
        }
    }

    #[test]
    fn private_hosts_are_told_from_public_ones() {
        for private in
            ["localhost", "api.localhost", "127.0.0.1", "10.1.2.3", "169.254.169.254", "[::1]", "[fd00::1]", "[::ffff:10.0.0.1]", "0.0.0.0"]
        {
            assert!(is_private_host(private), "{private}");
        }
        for public in ["mcp.example.com", "8.8.8.8", "[2001:4860:4860::8888]", "100.128.0.1", "198.20.0.1", "[64:ff9b::808:808]"] {
            assert!(!is_private_host(public), "{public}");
        }
        for private in ["100.100.100.200", "0.1.2.3", "192.0.0.192", "198.18.0.1", "[64:ff9b::a9fe:a9fe]", "[::ffff:169.254.169.254]"] {
            assert!(is_private_host(private), "{private}");
        }
    }

    #[tokio::test]
    async fn names_resolving_to_private_addresses_are_not_handed_to_the_client() -> Result<(), Box<dyn std::error::Error>> {
        use reqwest::dns::Resolve;
        let strict = PublicAddressesOnly::default();
        let refused = strict.resolve("localhost".parse()?).await.err().map(|error| error.to_string()).unwrap_or_default();
        assert!(refused.contains("resolves only to private"), "{refused}");
        // The operator's proxy resolves wherever it is.
        let proxied = PublicAddressesOnly { trusted: vec!["localhost".to_string()].into() };
        assert!(proxied.resolve("localhost".parse()?).await.is_ok());
        // End to end: a client for tenants' URLs does not reach a listener on loopback by name;
        // the operator's switch lets it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://localhost:{}/", listener.local_addr()?.port());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                use tokio::io::{AsyncReadExt, AsyncWriteExt};
                let mut request = [0u8; 2048];
                let _ = socket.read(&mut request).await;
                let _ = socket.write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n").await;
            }
        });
        let attempt = tenant_http_client(false).build()?.get(&url).send().await;
        let error = attempt.err().map(|error| format!("{error:?}")).unwrap_or_default();
        assert!(error.contains("resolves only to private"), "{error}");
        assert_eq!(tenant_http_client(true).build()?.get(&url).send().await?.status(), 204);
        Ok(())
    }

    #[tokio::test]
    async fn redirects_are_followed_within_one_origin_only() -> Result<(), Box<dyn std::error::Error>> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let base = format!("http://127.0.0.1:{}", listener.local_addr()?.port());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let mut request = [0u8; 2048];
                    let read = socket.read(&mut request).await.unwrap_or(0);
                    let text = String::from_utf8_lossy(&request[..read]).to_string();
                    let answer = if text.starts_with("GET /mcp/ ") {
                        "HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n".to_string()
                    } else if text.starts_with("GET /mcp ") {
                        "HTTP/1.1 307 Temporary Redirect\r\nlocation: /mcp/\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string()
                    } else {
                        "HTTP/1.1 302 Found\r\nlocation: http://169.254.169.254/latest\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
                            .to_string()
                    };
                    let _ = socket.write_all(answer.as_bytes()).await;
                });
            }
        });
        let client = tenant_http_client(true).build()?;
        assert_eq!(client.get(format!("{base}/mcp")).send().await?.status(), 204, "same origin: followed");
        assert_eq!(client.get(format!("{base}/elsewhere")).send().await?.status(), 302, "another origin: not followed");
        Ok(())
    }
}
