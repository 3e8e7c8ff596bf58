fn main() -> anyhow::Result<()> {
    primus_service::main(
        primus_data_executor::SERVICE,
        primus_data_executor::ABOUT,
        primus_data_executor::default_settings(),
        primus_data_executor::run,
    )
}
