//! The catalog-health-sentinel contract: the BYOK key vault, model aliases and routing presets.

#[allow(clippy::all, missing_docs)]
mod v1 {
    tonic::include_proto!("brainstorm.catalog.v1");
}

use v1::catalog_service_client::CatalogServiceClient;
use v1::catalog_service_server::CatalogServiceServer;
pub use v1::*;

crate::grpc::service_contract! {
    service CatalogService;
    client CatalogClient;
    generated_client CatalogServiceClient;
    generated_server CatalogServiceServer;
    generated_server_trait v1::catalog_service_server::CatalogService;
    methods {
        /// Live-validates a key against its provider; stores nothing.
        fn test_provider_key(TestProviderKeyRequest) -> TestProviderKeyResponse;
        /// Live-validates, encrypts and stores a key, rotating out the provider's previous key.
        fn register_provider_key(RegisterProviderKeyRequest) -> ProviderKey;
        /// The tenant's keys, masked.
        fn list_provider_keys(TenantRef) -> ProviderKeyList;
        /// Deactivates a key (by key id or provider id); the record stays for audit.
        fn deactivate_provider_key(DeactivateProviderKeyRequest) -> ProviderKey;
        /// Decrypted active keys, aliases and presets of a tenant, for the edge's routing cache.
        fn get_routing_config(TenantRef) -> RoutingConfig;
        /// The tenant's alias map.
        fn get_aliases(TenantRef) -> AliasMap;
        /// Replaces the tenant's alias map.
        fn put_aliases(PutAliasesRequest) -> AliasMap;
        /// The tenant's presets.
        fn list_presets(TenantRef) -> PresetList;
        /// One preset.
        fn get_preset(PresetRef) -> Preset;
        /// Creates (or with `replace`, replaces) a preset.
        fn put_preset(PutPresetRequest) -> Preset;
        /// Deletes a preset and returns it.
        fn delete_preset(PresetRef) -> Preset;
    }
}
