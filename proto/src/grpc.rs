//! One macro that turns a list of methods into a service's trait, its client and both gRPC adapters.

/// Declares `trait $Trait`, the cheap clonable `$Client` (`local`, `grpc`, `as_grpc_service`) and the two
/// adapters between the trait and the tonic-generated client and server, from a single method list.
macro_rules! service_contract {
    (
        service $Trait:ident;
        client $Client:ident;
        generated_client $GeneratedClient:ident;
        generated_server $GeneratedServer:ident;
        generated_server_trait $GeneratedServerTrait:path;
        methods {
            $( $(#[$doc:meta])* fn $method:ident($Request:ty) -> $Response:ty; )*
        }
    ) => {
        #[doc = concat!("The ", stringify!($Trait), " contract: implemented in-process by the service crate.")]
        #[async_trait::async_trait]
        pub trait $Trait: Send + Sync + 'static {
            $( $(#[$doc])* async fn $method(&self, request: $Request) -> $crate::ServiceResult<$Response>; )*
        }

        #[doc = concat!("A handle on the ", stringify!($Trait), ", local or remote; callers never know which.")]
        #[derive(Clone)]
        pub struct $Client {
            inner: std::sync::Arc<dyn $Trait>,
        }

        impl std::fmt::Debug for $Client {
            fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                formatter.write_str(stringify!($Client))
            }
        }

        impl $Client {
            /// Calls an implementation living in this process directly.
            pub fn local(service: impl $Trait) -> Self {
                $Client { inner: std::sync::Arc::new(service) }
            }

            /// Calls the service over a tonic channel.
            pub fn grpc(channel: tonic::transport::Channel) -> Self {
                let generated = $GeneratedClient::new(channel);
                $Client { inner: std::sync::Arc::new(GrpcClientAdapter { generated }) }
            }

            /// The tonic service that exposes this client (usually a local one) to remote callers.
            pub fn as_grpc_service(&self) -> $GeneratedServer<GrpcServerAdapter> {
                $GeneratedServer::new(GrpcServerAdapter { client: self.clone() })
            }

            /// Tests: this client served over real tonic gRPC on an in-memory duplex transport (no
            /// port opened), and a gRPC client to it.
            #[cfg(feature = "testing")]
            pub async fn over_grpc_duplex(&self) -> Result<Self, tonic::transport::Error> {
                let (client_io, server_io) = tokio::io::duplex(64 * 1024);
                let service = self.as_grpc_service();
                tokio::spawn(async move {
                    let incoming = tokio_stream::once(Ok::<_, std::io::Error>(server_io));
                    let _served = tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming).await;
                });
                let mut client_io = Some(client_io);
                let channel = tonic::transport::Endpoint::from_static("http://duplex.invalid")
                    .connect_with_connector(tower::service_fn(move |_| {
                        let io = client_io.take();
                        async move {
                            io.map(hyper_util::rt::TokioIo::new)
                                .ok_or_else(|| std::io::Error::other("the duplex transport connects once"))
                        }
                    }))
                    .await?;
                Ok(Self::grpc(channel))
            }

            $(
                $(#[$doc])*
                pub async fn $method(&self, request: $Request) -> $crate::ServiceResult<$Response> {
                    self.inner.$method(request).await
                }
            )*
        }

        /// Implements the service trait by calling a remote server.
        struct GrpcClientAdapter {
            generated: $GeneratedClient<tonic::transport::Channel>,
        }

        #[async_trait::async_trait]
        impl $Trait for GrpcClientAdapter {
            $(
                async fn $method(&self, request: $Request) -> $crate::ServiceResult<$Response> {
                    // Clones of a tonic client share one channel: cheap, and no `&mut self` needed.
                    let mut generated = self.generated.clone();
                    let mut call = tonic::Request::new(request);
                    $crate::trace::inject(call.metadata_mut());
                    generated
                        .$method(call)
                        .await
                        .map(tonic::Response::into_inner)
                        .map_err($crate::ServiceError::from)
                }
            )*
        }

        /// Serves remote calls by forwarding them to a client.
        #[derive(Clone)]
        pub struct GrpcServerAdapter {
            client: $Client,
        }

        #[tonic::async_trait]
        impl $GeneratedServerTrait for GrpcServerAdapter {
            $(
                async fn $method(
                    &self,
                    request: tonic::Request<$Request>,
                ) -> Result<tonic::Response<$Response>, tonic::Status> {
                    use tracing::Instrument as _;
                    let span = $crate::trace::server_span(stringify!($Trait), stringify!($method), request.metadata());
                    self.client
                        .$method(request.into_inner())
                        .instrument(span)
                        .await
                        .map(tonic::Response::new)
                        .map_err(tonic::Status::from)
                }
            )*
        }
    };
}

pub(crate) use service_contract;
