fn main() -> anyhow::Result<()> {
    primus_service::main(
        primus_serving_sync::SERVICE,
        primus_serving_sync::ABOUT,
        primus_serving_sync::default_settings(),
        primus_serving_sync::run,
    )
}
