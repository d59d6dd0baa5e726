//! The observability-fanout contract: destinations, XDR connectors, delivery counters, and the relay of events.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.observability.v1");
}

use v1::observability_fanout_service_client::ObservabilityFanoutServiceClient;
use v1::observability_fanout_service_server::ObservabilityFanoutServiceServer;
pub use v1::*;

crate::grpc::service_contract! {
    service ObservabilityFanoutService;
    client ObservabilityFanoutClient;
    generated_client ObservabilityFanoutServiceClient;
    generated_server ObservabilityFanoutServiceServer;
    generated_server_trait v1::observability_fanout_service_server::ObservabilityFanoutService;
    methods {
        /// Creates a destination, sealing its secret members.
        fn create_destination(CreateDestinationRequest) -> Destination;
        /// The tenant's destinations of one kind.
        fn list_destinations(ListDestinationsRequest) -> DestinationList;
        /// Changes a destination.
        fn update_destination(UpdateDestinationRequest) -> Destination;
        /// Removes a destination.
        fn delete_destination(DestinationRef) -> Destination;
        /// Enables or disables a destination.
        fn set_enabled(SetEnabledRequest) -> Destination;
        /// Sends one synthetic event.
        fn test_destination(DestinationRef) -> TestResult;
        /// The last 24 hours' deliveries.
        fn destination_stats(DestinationRef) -> DeliveryStats;
        /// The tenant's fan-out switch.
        fn get_config(TenantRef) -> FanoutConfig;
        /// Sets the tenant's fan-out switch.
        fn put_config(FanoutConfig) -> FanoutConfig;
        /// Takes events relayed by an edge without a shared bus.
        fn record_events(FanoutEvents) -> RecordEventsResponse;
    }
}
