fn main() -> anyhow::Result<()> {
    primus_service::main(
        primus_api_server::SERVICE,
        primus_api_server::ABOUT,
        primus_api_server::default_settings(),
        primus_api_server::run,
    )
}
