//! The REST listener over TLS (`BR_TLS_CERT_FILE`, `BR_TLS_KEY_FILE`): HTTPS with the configured
//! certificate, read again when its files change (a rotated Secret needs no restart), HTTP/2 and
//! HTTP/1.1 by ALPN, and optional client certificates. A client that
//! presents one must prove in the handshake that it holds the certificate's key; the leaf then
//! rides on every request of the connection (`ClientCertificate`) and identity decides, on each
//! use, whether the agent CA issued it to an agent that may still act.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use anyhow::Context;
use axum::Router;
use axum::extract::Request;
use brainstorm_common::config::TlsFiles;
use brainstorm_edge_router::ClientCertificate;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, InconsistentKeys, ServerConfig, SignatureScheme};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::shutdown::Shutdown;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stop waits for open connections to finish their requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// How often the certificate files are read again for a rotation (cert-manager and the kubelet
/// replace a mounted Secret's files in place).
const RELOAD_INTERVAL: Duration = Duration::from_secs(5);

/// Serves `router` over HTTPS on `listen` until shutdown, then lets open connections finish.
pub async fn serve_https(listen: std::net::SocketAddr, router: Router, files: &TlsFiles, shutdown: Shutdown) -> anyhow::Result<()> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let files_read = read_files(files).await?;
    let certificate = Arc::new(CurrentCertificate(RwLock::new(Arc::new(certified_key(&files_read, &provider)?))));
    let acceptor = TlsAcceptor::from(Arc::new(server_config(certificate.clone(), provider.clone())?));
    let reloading = tokio::spawn(reload_on_change(files.clone(), files_read, certificate, provider));
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("cannot listen on {listen}"))?;
    tracing::info!(address = %listen, "serving REST over HTTPS (agent client certificates accepted)");
    let graceful = GracefulShutdown::new();
    let builder = Builder::new(TokioExecutor::new());
    let stop = shutdown.requested();
    tokio::pin!(stop);
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Out of descriptors and the like: back off instead of spinning.
                    tracing::warn!(%error, "cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut stop => break,
        };
        if let Err(error) = stream.set_nodelay(true) {
            tracing::debug!(%error, "cannot set TCP_NODELAY");
        }
        let (acceptor, router, builder, watcher) = (acceptor.clone(), router.clone(), builder.clone(), graceful.watcher());
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => return tracing::debug!(%error, %peer, "TLS handshake failed"),
                Err(_) => return tracing::debug!(%peer, "TLS handshake timed out"),
            };
            let certificate =
                stream.get_ref().1.peer_certificates().and_then(<[_]>::first).map(|leaf| ClientCertificate(Arc::from(leaf.as_ref())));
            let service = router.map_request(move |mut request: Request<hyper::body::Incoming>| {
                if let Some(certificate) = &certificate {
                    request.extensions_mut().insert(certificate.clone());
                }
                // The peer, for a trusted proxy's forwarded certificates.
                request.extensions_mut().insert(axum::extract::ConnectInfo(peer));
                request
            });
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%error, %peer, "HTTPS connection ended with an error");
            }
        });
    }
    drop(listener);
    reloading.abort();
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!("HTTPS connections still open after {DRAIN_TIMEOUT:?}: closing them");
    }
    tracing::info!(address = %listen, "HTTPS server stopped");
    Ok(())
}

/// The server's TLS configuration: the current certificate, client certificates optional.
fn server_config(certificate: Arc<CurrentCertificate>, provider: Arc<CryptoProvider>) -> anyhow::Result<ServerConfig> {
    let verifier = Arc::new(PresentedCertificate { algorithms: provider.signature_verification_algorithms });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_cert_resolver(certificate);
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// The certificate chain file's and the key file's bytes.
type FilesRead = (Vec<u8>, Vec<u8>);

async fn read_files(files: &TlsFiles) -> anyhow::Result<FilesRead> {
    let chain = tokio::fs::read(&files.certificate_chain)
        .await
        .with_context(|| format!("cannot read BR_TLS_CERT_FILE {}", files.certificate_chain.display()))?;
    let key = tokio::fs::read(&files.private_key)
        .await
        .with_context(|| format!("cannot read BR_TLS_KEY_FILE {}", files.private_key.display()))?;
    Ok((chain, key))
}

/// The chain and key (PEM) as a certificate rustls serves; refused when the key is not the
/// certificate's.
fn certified_key((chain, key): &FilesRead, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
    let chain: Vec<CertificateDer<'static>> =
        CertificateDer::pem_slice_iter(chain).collect::<Result<_, _>>().context("BR_TLS_CERT_FILE is not a PEM certificate chain")?;
    anyhow::ensure!(!chain.is_empty(), "BR_TLS_CERT_FILE holds no PEM certificate");
    let key = PrivateKeyDer::from_pem_slice(key).context("BR_TLS_KEY_FILE holds no PEM private key")?;
    let signing_key = provider.key_provider.load_private_key(key).context("BR_TLS_KEY_FILE's key is not one rustls can sign with")?;
    let certified = CertifiedKey::new(chain, signing_key);
    match certified.keys_match() {
        Ok(()) | Err(rustls::Error::InconsistentKeys(InconsistentKeys::Unknown)) => Ok(certified),
        Err(error) => Err(anyhow::anyhow!("BR_TLS_KEY_FILE's key is not the key of BR_TLS_CERT_FILE's certificate: {error}")),
    }
}

/// Reads the files every `RELOAD_INTERVAL`; when they changed and make a good certificate and key,
/// new handshakes get it (open connections keep theirs). A half-written or mismatched pair is
/// logged and the current certificate kept.
async fn reload_on_change(files: TlsFiles, mut last: FilesRead, current: Arc<CurrentCertificate>, provider: Arc<CryptoProvider>) {
    let mut ticks = tokio::time::interval(RELOAD_INTERVAL);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let read = match read_files(&files).await {
            Ok(read) if read != last => read,
            Ok(_) => continue,
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "cannot read the TLS certificate files; serving the current certificate");
                continue;
            }
        };
        match certified_key(&read, &provider) {
            Ok(certified) => {
                if let Ok(mut serving) = current.0.write() {
                    *serving = Arc::new(certified);
                    tracing::info!("the TLS certificate files changed: new connections get the new certificate");
                }
            }
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "the changed TLS certificate files are not usable yet; serving the current certificate")
            }
        }
        last = read;
    }
}

/// The certificate new handshakes get, swapped when its files change.
#[derive(Debug)]
struct CurrentCertificate(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for CurrentCertificate {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|current| Arc::clone(&current))
    }
}

/// Asks every client for a certificate without insisting (API-key clients send none), and accepts
/// any whose key the client proves it holds: the handshake signatures are verified here, the
/// certificate's issuer, life and agent by identity on each request that relies on it.
#[derive(Debug)]
struct PresentedCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for PresentedCertificate {
    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, certificate, signature, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        certificate: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, certificate, signature, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> FilesRead {
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap().self_signed(&key).unwrap();
        (certificate.pem().into_bytes(), key.serialize_pem().into_bytes())
    }

    #[test]
    fn a_certificate_is_served_only_with_its_own_key() {
        let provider = rustls::crypto::ring::default_provider();
        let (chain, key) = pair();
        assert!(certified_key(&(chain.clone(), key.clone()), &provider).is_ok());
        let (_, other_key) = pair();
        let mismatched = certified_key(&(chain.clone(), other_key), &provider).unwrap_err();
        assert!(format!("{mismatched:#}").contains("is not the key of"), "{mismatched:#}");
        assert!(certified_key(&(b"no PEM here".to_vec(), key.clone()), &provider).is_err());
        assert!(certified_key(&(chain, b"no key".to_vec()), &provider).is_err());
    }
}
