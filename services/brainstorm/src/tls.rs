//! The REST listener over TLS (`BR_TLS_CERT_FILE`, `BR_TLS_KEY_FILE`): HTTPS with the configured
//! certificate, HTTP/2 and HTTP/1.1 by ALPN, and optional client certificates. A client that
//! presents one must prove in the handshake that it holds the certificate's key; the leaf then
//! rides on every request of the connection (`ClientCertificate`) and identity decides, on each
//! use, whether the agent CA issued it to an agent that may still act.

use std::sync::Arc;
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
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, ServerConfig, SignatureScheme};
use tokio_rustls::TlsAcceptor;
use tower::ServiceExt;

use crate::shutdown::Shutdown;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stop waits for open connections to finish their requests.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `router` over HTTPS on `listen` until shutdown, then lets open connections finish.
pub async fn serve_https(listen: std::net::SocketAddr, router: Router, files: &TlsFiles, shutdown: Shutdown) -> anyhow::Result<()> {
    let acceptor = TlsAcceptor::from(Arc::new(server_config(files)?));
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
                request
            });
            let connection = builder.serve_connection_with_upgrades(TokioIo::new(stream), TowerToHyperService::new(service));
            if let Err(error) = watcher.watch(connection.into_owned()).await {
                tracing::debug!(%error, %peer, "HTTPS connection ended with an error");
            }
        });
    }
    drop(listener);
    if tokio::time::timeout(DRAIN_TIMEOUT, graceful.shutdown()).await.is_err() {
        tracing::warn!("HTTPS connections still open after {DRAIN_TIMEOUT:?}: closing them");
    }
    tracing::info!(address = %listen, "HTTPS server stopped");
    Ok(())
}

/// The server's TLS configuration: the configured chain and key, client certificates optional.
fn server_config(files: &TlsFiles) -> anyhow::Result<ServerConfig> {
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&files.certificate_chain)
        .and_then(Iterator::collect)
        .with_context(|| format!("cannot read certificates from BR_TLS_CERT_FILE {}", files.certificate_chain.display()))?;
    anyhow::ensure!(!chain.is_empty(), "BR_TLS_CERT_FILE {} holds no PEM certificate", files.certificate_chain.display());
    let key = PrivateKeyDer::from_pem_file(&files.private_key)
        .with_context(|| format!("cannot read a private key from BR_TLS_KEY_FILE {}", files.private_key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let verifier = Arc::new(PresentedCertificate { algorithms: provider.signature_verification_algorithms });
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .context("BR_TLS_CERT_FILE and BR_TLS_KEY_FILE do not make a usable certificate and key")?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
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
